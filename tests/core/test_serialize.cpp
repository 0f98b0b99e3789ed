// safetensors files (core/serialize.h): round trips, the byte layout the spec gives, the reference
// files written by tools/make_safetensors_fixture.py (BF16 and F16 included), every class of
// corrupt file, atomic saves (also under SIGKILL: a child process saving in a loop is killed at
// random points).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "core/kernels/pointwise.h"
#include "core/parallel.h"
#include "core/serialize.h"
#include "cuda/memory.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;
namespace fs = std::filesystem;

namespace {

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = char((v >> (8 * i)) & 0xff);
  return s;
}
// A whole file from its header text and data bytes, as the spec lays it out (no padding added).
std::string file_from(const std::string& header, const std::string& data) {
  return u64_le(header.size()) + header + data;
}
template <class T>
std::string bytes_of(std::initializer_list<T> values) {
  std::string s(values.size() * sizeof(T), '\0');
  std::memcpy(s.data(), values.begin(), s.size());
  return s;
}

const Tensor& find(const std::vector<std::pair<std::string, Tensor>>& ts, const std::string& name) {
  for (const auto& [n, t] : ts)
    if (n == name) return t;
  FAIL("no tensor named " << name);
  static Tensor none;
  return none;
}

}  // namespace

TEST_CASE("serialize: round trip of f32, f64, i64 and b8 tensors, 0-dim, empty, non-contiguous, metadata") {
  TempDir tmp("roundtrip");
  const std::string path = tmp.file("model.safetensors");
  Tensor w = tensor<float>({0.5f, -1.25f, 3e-8f, -0.0f, INFINITY, 7.f}, {2, 3});
  Tensor wt = w.transpose(0, 1);  // non-contiguous [3,2]: saved as [[0.5,-0],[-1.25,inf],[3e-8,7]]
  REQUIRE_FALSE(wt.is_contiguous());
  Tensor sliced = arange(0, 10, 1, DType::f64).slice(0, 1, 9, 3);  // [1, 4, 7]: stride 3, offset 1
  Tensor d = tensor<double>({1.0 / 3.0, -2.5e300, 1e-310}, {3, 1});
  Tensor i = tensor<int64_t>({-1, 0, int64_t(1) << 40, INT64_MIN});
  Tensor b = tensor<bool>({true, false, false, true, true, false}, {3, 2});
  Tensor s = scalar_tensor(-3.5, DType::f32);
  Tensor e = zeros({0, 4}, DType::f64);
  std::map<std::string, std::string> meta{{"step", "100"}, {"note", "ünïcode \"quoted\"\n"}};
  const std::vector<std::pair<std::string, Tensor>> saved{
      {"w", w}, {"w.t", wt}, {"sliced", sliced}, {"d", d}, {"i", i}, {"b", b}, {"s", s}, {"e", e}};
  save_safetensors(path, saved, meta);

  std::map<std::string, std::string> got_meta;
  auto loaded = load_safetensors(path, &got_meta);
  CHECK(got_meta == meta);
  REQUIRE(loaded.size() == saved.size());
  for (size_t k = 0; k < saved.size(); ++k) {
    INFO("tensor " << saved[k].first);
    CHECK(loaded[k].first == saved[k].first);  // file order is the order given to save
    const Tensor& a = loaded[k].second;
    const Tensor& x = saved[k].second;
    CHECK(a.shape() == x.shape());
    CHECK(a.dtype() == x.dtype());
    CHECK(a.device() == Device::cpu());
    CHECK(a.is_contiguous());
  }
  // bit-exact values (including -0, inf, a double subnormal and INT64_MIN)
  CHECK(find(loaded, "w").to_vector<float>() == w.to_vector<float>());
  CHECK(std::signbit(find(loaded, "w").to_vector<float>()[3]));
  CHECK(find(loaded, "w.t").to_vector<float>() == std::vector<float>{0.5f, -0.0f, -1.25f, INFINITY, 3e-8f, 7.f});
  CHECK(find(loaded, "sliced").to_vector<double>() == std::vector<double>{1, 4, 7});
  CHECK(find(loaded, "d").to_vector<double>() == std::vector<double>{1.0 / 3.0, -2.5e300, 1e-310});
  CHECK(find(loaded, "i").to_vector<int64_t>() == std::vector<int64_t>{-1, 0, int64_t(1) << 40, INT64_MIN});
  CHECK(find(loaded, "b").to_vector<int>() == std::vector<int>{1, 0, 0, 1, 1, 0});
  CHECK(find(loaded, "s").ndim() == 0);
  CHECK(find(loaded, "s").item<float>() == -3.5f);
  CHECK(find(loaded, "e").numel() == 0);

  // the map form and a file without metadata (which reads back as empty metadata)
  auto by_name = load_safetensors_map(path);
  CHECK(by_name.size() == saved.size());
  CHECK(by_name.at("i").to_vector<int64_t>()[2] == int64_t(1) << 40);
  save_safetensors(path, {{"only", s}});
  got_meta = {{"stale", "x"}};
  CHECK(load_safetensors(path, &got_meta).size() == 1);
  CHECK(got_meta.empty());
  // nothing at all is a valid file too: the header "{}" padded to 8 bytes
  save_safetensors(path, {});
  CHECK(read_bytes(path) == u64_le(8) + "{}      ");
  CHECK(load_safetensors(path).empty());

  // a tensor that records history is saved by value, without touching its graph
  Tensor leaf = leaf64({2, 2});
  Tensor y = mul(leaf, 2.0);
  save_safetensors(path, {{"y", y}});
  check_close(load_safetensors(path)[0].second, y, 0, 0);
}

TEST_CASE("serialize: the writer produces the spec's bytes exactly") {
  TempDir tmp("spec");
  const std::string path = tmp.file("a.safetensors");
  save_safetensors(path,
                   {{"a", tensor<float>({1.f, -2.f})}, {"b", scalar_tensor(5, DType::i64)},
                    {"c", tensor<bool>({true, false, true})}},
                   {{"k", "v"}});
  // compact JSON, "__metadata__" first, tensors in the order given, keys dtype/shape/data_offsets;
  // 188 characters, padded with 4 spaces to 192 (a multiple of 8)
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"I64","shape":[],"data_offsets":[8,16]},"c":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})";
  REQUIRE(header.size() == 188);
  const std::string expected = u64_le(192) + header + std::string(4, ' ') + bytes_of<float>({1.f, -2.f}) +
                               bytes_of<int64_t>({5}) + std::string("\x01\x00\x01", 3);
  CHECK(read_bytes(path) == expected);
}

TEST_CASE("serialize: the reader follows the spec, not our writer's layout") {
  TempDir tmp("reader");
  const std::string path = tmp.file("h.safetensors");
  // whitespace and newlines in the JSON, keys in another order, data not in header order,
  // an unpadded header length, metadata last
  const std::string header = "{ \"z\" : {\"data_offsets\": [8, 24], \"shape\": [2], \"dtype\": \"F64\"},\n"
                             "  \"y\": {\"shape\": [2,1], \"dtype\": \"F32\", \"data_offsets\": [0, 8]},\n"
                             "  \"__metadata__\": {\"a\": \"1\"} }";
  write_bytes(path, file_from(header, bytes_of<float>({0.25f, -4.f}) + bytes_of<double>({1e100, -0.5})));
  std::map<std::string, std::string> meta;
  auto ts = load_safetensors(path, &meta);
  REQUIRE(ts.size() == 2);
  CHECK(ts[0].first == "y");  // data order
  CHECK(ts[1].first == "z");
  CHECK(ts[0].second.shape() == Shape{2, 1});
  CHECK(ts[0].second.to_vector<float>() == std::vector<float>{0.25f, -4.f});
  CHECK(ts[1].second.dtype() == DType::f64);
  CHECK(ts[1].second.to_vector<double>() == std::vector<double>{1e100, -0.5});
  CHECK(meta == std::map<std::string, std::string>{{"a", "1"}});
}

TEST_CASE("serialize: reads the reference file and writes it back byte for byte") {
  // tests/golden/reference.safetensors is written by tools/make_safetensors_fixture.py (torch,
  // laid out as the reference writer does: larger dtypes first, then by name).
  const std::string golden = std::string(ATTOGRAD_TEST_DATA) + "/reference.safetensors";
  std::map<std::string, std::string> meta;
  auto ts = load_safetensors(golden, &meta);
  CHECK(meta == std::map<std::string, std::string>{{"format", "pt"}, {"step", "42"}});
  std::vector<std::string> names;
  for (const auto& [n, t] : ts) names.push_back(n);
  CHECK(names == std::vector<std::string>{"i.index", "d.double", "e.empty", "s.scalar", "t.transposed", "w.bias",
                                          "w.weight", "m.mask"});
  CHECK(find(ts, "w.weight").shape() == Shape{2, 3});
  CHECK(find(ts, "w.weight").to_vector<float>() == std::vector<float>{0.5f, -1.25f, 2.f, 3.f, -0.f, 1e-3f});
  CHECK(find(ts, "w.bias").to_vector<float>() == std::vector<float>{0.25f, -8.f, 1024.5f});
  CHECK(find(ts, "t.transposed").shape() == Shape{2, 3});
  CHECK(find(ts, "t.transposed").to_vector<float>() == std::vector<float>{1, 3, 5, 2, 4, 6});
  CHECK(find(ts, "s.scalar").ndim() == 0);
  CHECK(find(ts, "s.scalar").item<float>() == -3.5f);
  CHECK(find(ts, "e.empty").shape() == Shape{0, 3});
  CHECK(find(ts, "d.double").dtype() == DType::f64);
  CHECK(find(ts, "d.double").to_vector<double>() == std::vector<double>{1.0 / 3.0, -2.5, 1e-300});
  CHECK(find(ts, "i.index").dtype() == DType::i64);
  CHECK(find(ts, "i.index").to_vector<int64_t>() == std::vector<int64_t>{-1, 0, int64_t(1) << 40, 7});
  CHECK(find(ts, "m.mask").dtype() == DType::b8);
  CHECK(find(ts, "m.mask").to_vector<int>() == std::vector<int>{1, 0, 0, 1});

  TempDir tmp("golden");
  const std::string path = tmp.file("again.safetensors");
  save_safetensors(path, ts, meta);
  CHECK(read_bytes(path) == read_bytes(golden));
}

TEST_CASE("serialize: BF16 and F16 tensors, rounded by PyTorch, read as bf16 and f16 and written back byte for byte") {
  // tests/golden/half.safetensors: these f32 values rounded by torch's .to(bfloat16) / .to(float16)
  const std::vector<float> bf16_source = {1.f, 1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, -0.1f,
                                          3.0e38f, 1e-40f, 1.99999f, 0.1f};
  const std::vector<float> f16_source = {1.f, 1.f + 0x1p-11f, -0.1f, 65504.f, 0x1p-24f, 1e-6f, 0.1f, -3.14159f};
  // what torch stored (the file's bits), by hand: ties to even (1 + 2^-8 -> 1, 1 + 3 2^-8 ->
  // 1 + 2^-6; half: 1 + 2^-11 -> 1), a carry (1.99999 -> 2), a bf16 subnormal (1e-40 -> 2^-133 x 64)
  const std::vector<uint32_t> bf16_bits = {0x3f80, 0x3f80, 0x3f82, 0xbdcd, 0x7f62, 0x0001, 0x4000, 0x3dcd};
  const std::vector<float> f16_values = {1.f, 1.f, -0.0999755859f, 65504.f, 5.96046448e-08f, 1.01327896e-06f,
                                         0.0999755859f, -3.140625f};
  const std::string golden = std::string(ATTOGRAD_TEST_DATA) + "/half.safetensors";
  const auto ts = load_safetensors(golden);
  REQUIRE(ts.size() == 2);
  const Tensor& b = find(ts, "b.bf16");
  const Tensor& h = find(ts, "h.f16");
  CHECK(b.dtype() == DType::bf16);
  CHECK(b.shape() == Shape{2, 4});
  CHECK(h.dtype() == DType::f16);
  const std::vector<float> bv = b.to_vector<float>(), hv = h.to_vector<float>();
  for (size_t i = 0; i < 8; ++i) {
    CAPTURE(i);
    CHECK(pw::float_bits(bv[i]) == bf16_bits[i] << 16);
    CHECK(pw::float_bits(bv[i]) == pw::float_bits(pw::round_bf16(bf16_source[i])));  // ours rounds as torch does
    CHECK(hv[i] == f16_values[i]);
    CHECK(hv[i] == pw::round_fp16(f16_source[i]));
  }
  // the f32 sources saved as BF16 and as F16: the bytes torch wrote
  TempDir tmp("half");
  const Tensor bs = from_vector<float>(bf16_source, {2, 4}), hs = from_vector<float>(f16_source, {8});
  const std::string golden_bytes = read_bytes(golden);
  // one file holds both formats: write each half with its own storage and compare the data parts
  save_safetensors(tmp.file("b.safetensors"), {{"b.bf16", bs}}, {}, FloatStorage::bf16);
  save_safetensors(tmp.file("h.safetensors"), {{"h.f16", hs}}, {}, FloatStorage::f16);
  const std::string bfile = read_bytes(tmp.file("b.safetensors")), hfile = read_bytes(tmp.file("h.safetensors"));
  CHECK(bfile.substr(bfile.size() - 16) == golden_bytes.substr(golden_bytes.size() - 32, 16));
  CHECK(hfile.substr(hfile.size() - 16) == golden_bytes.substr(golden_bytes.size() - 16));
  CHECK(bfile.find("\"dtype\":\"BF16\"") != std::string::npos);
  CHECK(hfile.find("\"dtype\":\"F16\"") != std::string::npos);
  // and what is written reads back as the rounded values
  CHECK(load_safetensors_map(tmp.file("b.safetensors")).at("b.bf16").to_vector<float>() == bv);
  CHECK(load_safetensors_map(tmp.file("h.safetensors")).at("h.f16").to_vector<float>() == hv);
  // the 16-bit tensors as read, saved as they are: torch's file again, byte for byte
  save_safetensors(tmp.file("again.safetensors"), ts);
  CHECK(read_bytes(tmp.file("again.safetensors")) == golden_bytes);
  // and FloatStorage leaves 16-bit tensors alone (only f32 ones are rounded)
  save_safetensors(tmp.file("again16.safetensors"), ts, {}, FloatStorage::f16);
  CHECK(read_bytes(tmp.file("again16.safetensors")) == golden_bytes);
}

TEST_CASE("serialize: every finite half value is written as its own bits and read back as itself") {
  // the values of all 63488 finite IEEE half bit patterns, by the definition (in double, exact)
  std::vector<float> values;
  std::vector<uint16_t> bits;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) continue;  // inf and NaN: the FloatStorage case below
    const double mag = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(1.0 + double(m) / 1024.0, int(e) - 15);
    values.push_back(float(h & 0x8000u ? -mag : mag));
    bits.push_back(uint16_t(h));
  }
  REQUIRE(values.size() == 63488);
  TempDir tmp("allhalf");
  const std::string path = tmp.file("all.safetensors");
  save_safetensors(path, {{"h", from_vector<float>(values, {int64_t(values.size())})}}, {}, FloatStorage::f16);
  const std::string file = read_bytes(path);
  std::vector<uint16_t> written(bits.size());
  std::memcpy(written.data(), file.data() + file.size() - 2 * bits.size(), 2 * bits.size());
  CHECK(written == bits);
  const std::vector<float> back = load_safetensors_map(path).at("h").to_vector<float>();
  int bad = 0;
  for (size_t k = 0; k < values.size(); ++k) bad += pw::float_bits(back[k]) != pw::float_bits(values[k]);
  CHECK(bad == 0);
}

TEST_CASE("serialize: FloatStorage rounds only f32 tensors, halves the file, keeps NaN, refuses F16 overflow") {
  TempDir tmp("storage");
  Generator gen(3);
  const Tensor w = randn({64, 32}, DType::f32, &gen);
  const Tensor d = from_vector<double>({1.0 / 3.0, -2.0}, {2});
  const Tensor i = from_vector<int64_t>({5, -7}, {2});
  const Tensor m = gt(from_vector<float>({1.f, -1.f, 2.f}, {3}), 0.0);  // b8: 1 0 1
  const Tensor odd = from_vector<float>({std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                                         -0.f, 7e-45f},
                                        {4});
  const std::vector<std::pair<std::string, Tensor>> ts = {{"w", w}, {"d", d}, {"i", i}, {"m", m}, {"odd", odd}};
  save_safetensors(tmp.file("f32.safetensors"), ts);
  for (FloatStorage s : {FloatStorage::bf16, FloatStorage::f16}) {
    const bool bf = s == FloatStorage::bf16;
    CAPTURE(bf);
    const std::string path = tmp.file(bf ? "bf16.safetensors" : "f16.safetensors");
    save_safetensors(path, ts, {{"k", "v"}}, s);
    std::map<std::string, std::string> meta;
    const auto back = load_safetensors_map(path, &meta);
    CHECK(meta.at("k") == "v");
    // w's 8 KiB became 4 KiB: the file shrinks by the f32 tensors' half (header sizes aside)
    const auto f32_size = fs::file_size(tmp.file("f32.safetensors")), size = fs::file_size(path);
    CHECK(f32_size - size >= (64 * 32 + 4) * 2 - 64);
    CHECK(f32_size - size <= (64 * 32 + 4) * 2 + 64);
    const std::vector<float> wv = w.to_vector<float>(), got = back.at("w").to_vector<float>();
    int bad = 0;
    for (size_t k = 0; k < wv.size(); ++k)
      bad += pw::float_bits(got[k]) != pw::float_bits(bf ? pw::round_bf16(wv[k]) : pw::round_fp16(wv[k]));
    CHECK(bad == 0);
    CHECK(back.at("d").dtype() == DType::f64);  // other dtypes as they were
    CHECK(back.at("d").to_vector<double>() == d.to_vector<double>());
    CHECK(back.at("i").to_vector<int64_t>() == i.to_vector<int64_t>());
    CHECK(back.at("m").to_vector<int>() == std::vector<int>{1, 0, 1});
    const std::vector<float> o = back.at("odd").to_vector<float>();
    CHECK(std::isnan(o[0]));
    CHECK(o[1] == -std::numeric_limits<float>::infinity());
    CHECK(pw::float_bits(o[2]) == 0x80000000u);  // -0 stays -0
    CHECK(o[3] == (bf ? pw::round_bf16(7e-45f) : 0.f));  // below half's smallest subnormal: 0
  }
  // past 65504 a half is inf: refused for F16 (naming the tensor and the value), fine in BF16
  const Tensor big = from_vector<float>({1.f, 70000.f}, {2});
  const std::string path = tmp.file("big.safetensors");
  save_safetensors(path, {{"x", w}});
  const std::string before = read_bytes(path);
  AG_CHECK_ERROR(save_safetensors(path, {{"big", big}}, {}, FloatStorage::f16), "'big'", "element 1", "70000", "F16");
  CHECK(read_bytes(path) == before);  // the old file is untouched
  save_safetensors(path, {{"big", big}}, {}, FloatStorage::bf16);
  CHECK(load_safetensors_map(path).at("big").to_vector<float>() == std::vector<float>{1.f, 70144.f});
}

TEST_CASE("serialize: names must be unique and non-empty") {
  TempDir tmp("names");
  const std::string path = tmp.file("n.safetensors");
  Tensor x = ones({2});
  AG_CHECK_ERROR(save_safetensors(path, {{"a", x}, {"a", x}}), "save_safetensors", path.c_str(), "duplicate", "'a'");
  AG_CHECK_ERROR(save_safetensors(path, {{"a", x}, {"", x}}), "save_safetensors", path.c_str(), "empty name");
  AG_CHECK_ERROR(save_safetensors(path, {{"__metadata__", x}}), "save_safetensors", "reserved");
  AG_CHECK_ERROR(save_safetensors(path, {{"u", Tensor()}}), "save_safetensors", "'u'", "undefined");
  AG_CHECK_ERROR(save_safetensors(path, {{"bad\xff", x}}), "save_safetensors", "UTF-8");
  CHECK_FALSE(fs::exists(path));  // a refused save writes nothing
  CHECK(fs::is_empty(tmp.dir));   // and leaves no temporary file
}

TEST_CASE("serialize: a missing file and a truncated file are errors naming the file") {
  TempDir tmp("trunc");
  AG_CHECK_ERROR(load_safetensors(tmp.file("missing.safetensors")), "load_safetensors", "missing.safetensors",
                 "cannot open");
  AG_CHECK_ERROR(load_safetensors(tmp.dir.string()), "load_safetensors", "is a directory");

  const std::string good_path = tmp.file("good.safetensors");
  save_safetensors(good_path, {{"a", tensor<float>({1, 2, 3})}, {"b", tensor<int64_t>({4, 5})}}, {{"k", "v"}});
  const std::string good = read_bytes(good_path);
  const uint64_t header_len = good.size() - 12 - 16;  // f32[3] + i64[2] after the header
  const std::string path = tmp.file("cut.safetensors");
  // inside the length, inside the header, at its end, inside each tensor, one byte short
  for (size_t cut : {size_t(0), size_t(4), size_t(7), size_t(8), size_t(20), size_t(8 + header_len - 1),
                     size_t(8 + header_len), size_t(8 + header_len + 5), size_t(8 + header_len + 12),
                     good.size() - 1}) {
    INFO("file cut to " << cut << " of " << good.size() << " bytes");
    write_bytes(path, good.substr(0, cut));
    AG_CHECK_ERROR(load_safetensors(path), "load_safetensors", path.c_str());
  }
  write_bytes(path, good.substr(0, 5));
  AG_CHECK_ERROR(load_safetensors(path), "5 bytes", "too few");
  write_bytes(path, good.substr(0, 20));
  AG_CHECK_ERROR(load_safetensors(path), "header length", "exceeds");
  write_bytes(path, good.substr(0, 8 + header_len + 5));  // the data part is 5 of 28 bytes
  AG_CHECK_ERROR(load_safetensors(path), "out of range");
  write_bytes(path, good + "x");  // one byte too many
  AG_CHECK_ERROR(load_safetensors(path), "trailing data");
  write_bytes(path, good);
  CHECK(load_safetensors(path).size() == 2);
}

TEST_CASE("serialize: a corrupt header length is an error naming the file") {
  TempDir tmp("len");
  const std::string path = tmp.file("len.safetensors");
  save_safetensors(path, {{"a", tensor<float>({1, 2, 3})}});
  const std::string good = read_bytes(path);
  std::string bad = good;
  bad[7] = char(0x80);  // the top bit: 2^63 + N
  write_bytes(path, bad);
  AG_CHECK_ERROR(load_safetensors(path), path.c_str(), "header length", "limit");
  write_bytes(path, u64_le(good.size()) + good.substr(8));  // fits the limit, beyond the file
  AG_CHECK_ERROR(load_safetensors(path), path.c_str(), "exceeds");
  write_bytes(path, u64_le(10) + good.substr(8));  // too short: the JSON is cut
  AG_CHECK_ERROR(load_safetensors(path), path.c_str(), "malformed JSON");
  write_bytes(path, u64_le(0) + good.substr(8));
  AG_CHECK_ERROR(load_safetensors(path), path.c_str(), "does not start with a JSON object");
  uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  write_bytes(path, u64_le(n - 4) + good.substr(8));  // the data part now starts inside the header
  AG_CHECK_ERROR(load_safetensors(path), path.c_str());
}

TEST_CASE("serialize: every malformed header is an error naming the file and the tensor") {
  TempDir tmp("hdr");
  const std::string path = tmp.file("bad.safetensors");
  const std::string f8 = bytes_of<float>({1.f, 2.f});  // 8 bytes: one F32 [2] tensor
  struct Case {
    const char* what;
    std::string header, data;
    std::vector<const char*> fragments;
  };
  const std::vector<Case> cases{
      {"bad JSON", R"({"a":{"dtype":"F32",)", f8, {"malformed JSON"}},
      {"not UTF-8", "{\"a\xff\":{}}", f8, {"malformed JSON"}},
      {"not an object", R"([1, 2])", "", {"does not start with a JSON object"}},
      {"object then junk", R"({} [])", "", {"malformed JSON"}},
      {"entry not an object", R"({"a":[1,2]})", f8, {"'a'", "expected a JSON object, got array"}},
      {"empty name", R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f8, {"empty name"}},
      {"duplicate name",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       f8, {"duplicate key 'a'"}},
      {"unknown dtype", R"({"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", f8,
       {"'a'", "unknown dtype 'F8_E4M3'"}},
      {"BF16 of the wrong size", R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", f8,
       {"'a'", "BF16 [2] needs 4"}},
      {"dtype not a string", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", f8, {"'a'", "dtype"}},
      {"missing dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", f8, {"'a'", "dtype"}},
      {"unexpected key", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", f8, {"'a'", "'x'"}},
      {"negative dim", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f8, {"'a'", "non-negative"}},
      {"float dim", R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", f8, {"'a'", "non-negative"}},
      {"string dim", R"({"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", f8, {"'a'", "non-negative"}},
      {"shape not a list", R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", f8, {"'a'", "shape"}},
      {"too many dims", R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}})", f8,
       {"'a'", "9 dims"}},
      {"numel overflows", R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", f8,
       {"'a'", "too large"}},
      {"empty, but huge dims", R"({"a":{"dtype":"F64","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})",
       "", {"'a'", "too large"}},
      {"empty", R"({"a":{"dtype":"F64","shape":[0,3],"data_offsets":[0,8]}})", f8, {"'a'", "needs 0"}},
      {"missing offsets", R"({"a":{"dtype":"F32","shape":[2]}})", f8, {"'a'", "data_offsets"}},
      {"offsets not numbers", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})", f8,
       {"'a'", "data_offsets"}},
      {"one offset", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", f8, {"'a'", "data_offsets"}},
      {"negative offset", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", f8, {"'a'", "data_offsets"}},
      {"end before begin", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f8, {"'a'", "end before"}},
      {"out of range", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", f8, {"'a'", "out of range"}},
      {"huge offsets", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551608,18446744073709551615]}})",
       f8, {"'a'", "out of range"}},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f8, {"'a'", "needs 12"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       f8, {"'b'", "overlap", "'a'"}},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"BOOL","shape":[2],"data_offsets":[6,8]}})",
       f8, {"'b'", "gap"}},
      {"gap at the start", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8, {"'a'", "gap"}},
      {"trailing data", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f8, {"trailing data"}},
      {"metadata not an object", R"({"__metadata__":[1]})", "", {"__metadata__"}},
      {"metadata value not a string", R"({"__metadata__":{"step":100}})", "", {"__metadata__", "'step'"}},
      {"nested too deep", R"({"a":{"dtype":"F32","shape":[[2]],"data_offsets":[0,8]}})", f8, {"nested"}},
      {"bool byte not 0 or 1", R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x07", 2),
       {"'m'", "byte value 7"}},
  };
  for (const Case& c : cases) {
    INFO("case: " << std::string(c.what));
    write_bytes(path, file_from(c.header, c.data));
    std::string msg;
    try {
      load_safetensors(path);
    } catch (const Error& e) {
      msg = e.what();
    }
    INFO("message: " << msg);
    CHECK(msg.find("load_safetensors: '" + path + "'") == 0);
    for (const char* frag : c.fragments) CHECK(msg.find(frag) != std::string::npos);
  }
  // a deeply nested header stops at the depth check, without building the tree
  write_bytes(path, file_from("{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", ""));
  AG_CHECK_ERROR(load_safetensors(path), path.c_str(), "nested");
}

TEST_CASE("serialize: saving replaces the old file atomically, and a failed save leaves it intact") {
  TempDir tmp("atomic");
  const std::string path = tmp.file("ckpt.safetensors");
  save_safetensors(path, {{"v", tensor<float>({1, 2})}});
  save_safetensors(path, {{"v", tensor<float>({3, 4, 5})}}, {{"step", "2"}});
  auto ts = load_safetensors(path);
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].second.to_vector<float>() == std::vector<float>{3, 4, 5});
  CHECK(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()) == 1);  // no temporary left
  const std::string old_bytes = read_bytes(path);

  // the temporary cannot be created: a folder already sits at its name
  const std::string temp_name = path + ".tmp." + std::to_string(::getpid());
  fs::create_directory(temp_name);
  AG_CHECK_ERROR(save_safetensors(path, {{"v", tensor<float>({9})}}), "save_safetensors", path.c_str(),
                 "cannot create temporary file");
  CHECK(read_bytes(path) == old_bytes);
  fs::remove(temp_name);

  // in a folder that does not exist
  const std::string nowhere = tmp.file("no/such/folder/ckpt.safetensors");
  AG_CHECK_ERROR(save_safetensors(nowhere, {{"v", tensor<float>({9})}}), "save_safetensors", nowhere.c_str(),
                 "No such file or directory");
  CHECK(read_bytes(path) == old_bytes);

  // the rename fails (the target is a non-empty folder): the temporary is removed
  const std::string folder = tmp.file("folder.safetensors");
  fs::create_directories(folder + "/inside");
  AG_CHECK_ERROR(save_safetensors(folder, {{"v", tensor<float>({9})}}), "save_safetensors", folder.c_str(), "rename");
  CHECK_FALSE(fs::exists(folder + ".tmp." + std::to_string(::getpid())));
  CHECK(fs::is_directory(folder + "/inside"));
  CHECK(read_bytes(path) == old_bytes);

  // a relative path saves into the working folder (the folder fsynced is ".")
  {
    struct Chdir {  // back to the old working folder even if the save throws
      fs::path old = fs::current_path();
      explicit Chdir(const fs::path& to) { fs::current_path(to); }
      ~Chdir() { fs::current_path(old); }
    } in_tmp(tmp.dir);
    save_safetensors("rel.safetensors", {{"r", tensor<float>({6})}});
  }
  CHECK(load_safetensors(tmp.file("rel.safetensors"))[0].second.item<float>() == 6.f);
}

TEST_CASE("serialize: tensors on a GPU are saved from the host, contiguous or not") {
  if (skip_without_gpu()) return;
  TempDir tmp("cuda");
  const std::string path = tmp.file("gpu.safetensors");
  Tensor x = arange(0, 12, 1, DType::f32).reshape({3, 4});
  Tensor g = x.to(Device::cuda(0));
  save_safetensors(path, {{"g", g}, {"gt", g.transpose(0, 1)}, {"gs", g.slice(1, 1, 4, 2)}});
  auto ts = load_safetensors(path);
  CHECK(find(ts, "g").to_vector<float>() == x.to_vector<float>());
  CHECK(find(ts, "gt").to_vector<float>() == x.transpose(0, 1).to_vector<float>());
  CHECK(find(ts, "gs").to_vector<float>() == x.slice(1, 1, 4, 2).to_vector<float>());
  CHECK(find(ts, "gt").device() == Device::cpu());
}

namespace {

// One of the two checkpoints the killed child alternates between: 2 MiB of f32 whose every value
// depends on `which`, a small i64 tensor and metadata naming the content, so that a file mixing
// the two (or cut short) is told apart from both.
struct Content {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> meta;
};
Content kill_test_content(int which) {
  std::vector<float> w(size_t(1) << 19);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(which + 1) * 0.5f + float(i % 1000) * 1e-3f;
  return {{{"w", from_vector(w, {512, 1024})}, {"step", tensor<int64_t>({which, 1000 + which})}},
          {{"content", std::to_string(which)}}};
}

// Which content the file at `path` holds, checked byte for byte: 0, 1, or -1 (with the reason).
int identify(const std::string& path, const Content* contents, std::string* why) {
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> got;
  try {
    got = load_safetensors_map(path, &meta);
  } catch (const Error& e) {
    *why = e.what();
    return -1;
  }
  const int which = meta.count("content") ? std::atoi(meta["content"].c_str()) : -1;
  if (which != 0 && which != 1) return *why = "no content tag in the metadata", -1;
  if (meta != contents[which].meta) return *why = "metadata differs", -1;
  if (got.size() != contents[which].tensors.size()) return *why = "tensor count differs", -1;
  for (const auto& [name, want] : contents[which].tensors) {
    auto it = got.find(name);
    if (it == got.end() || it->second.shape() != want.shape() || it->second.dtype() != want.dtype() ||
        std::memcmp(it->second.raw_data(), want.raw_data(), size_t(want.nbytes())) != 0)
      return *why = "tensor '" + name + "' differs", -1;
  }
  return which;
}

}  // namespace

TEST_CASE("serialize: SIGKILL at random points of a save loop never leaves a torn checkpoint (50 kills)") {
  // A child process saves the two contents in turn as fast as it can; the parent kills it with
  // SIGKILL after a seeded random delay, 50 times. After every kill the checkpoint must load and
  // equal, byte for byte, one of the two contents: the last one saved completely. The only other
  // file allowed in the folder is the killed child's own temporary (path.tmp.<its pid>,
  // core/serialize.h), which a SIGKILL leaves behind; it is counted ("mid-write" kills) and removed
  // here (that nothing removes it later is the next test case).
  TempDir tmp("sigkill");
  const std::string path = tmp.file("ckpt.safetensors");
  const Content contents[2] = {kill_test_content(0), kill_test_content(1)};
  save_safetensors(path, contents[0].tensors, contents[0].meta);
  // the delays span ~3 saves, so kills land before, during and after a save; measured, not guessed
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) save_safetensors(path, contents[0].tensors, contents[0].meta);
  const double save_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 3;
  const int max_delay_us = int(std::clamp(3 * save_us, 2000.0, 60000.0));

  std::mt19937_64 rng(20240607);
  int on_disk = 0, mid_write = 0, changed = 0;
  for (int kill_no = 0; kill_no < 50; ++kill_no) {
    const int first = 1 - on_disk;  // the child's first save replaces what is on disk
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // The child only saves. A forked child must not start an OpenMP team (the parent's pool
      // does not exist here): keep every parallel_for inline.
      SerialScope serial;
      for (int i = first;; i = 1 - i) {
        try {
          save_safetensors(path, contents[i].tensors, contents[i].meta);
        } catch (...) {
          ::_exit(3);
        }
      }
    }
    const int delay_us = int(rng() % uint64_t(max_delay_us));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    INFO("kill " << kill_no << " after " << delay_us << " us");
    REQUIRE_MESSAGE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL), "the child ended otherwise: status ", status);

    const std::string own_temp = path + ".tmp." + std::to_string(pid);
    for (const auto& e : fs::directory_iterator(tmp.dir)) {
      const std::string p = e.path().string();
      CHECK_MESSAGE((p == path || p == own_temp), "stray file ", p);
    }
    if (fs::exists(own_temp)) ++mid_write, fs::remove(own_temp);
    std::string why;
    const int which = identify(path, contents, &why);
    REQUIRE_MESSAGE(which >= 0, "the checkpoint is torn: ", why);
    changed += which != on_disk;
    on_disk = which;
  }
  MESSAGE("50 SIGKILLs, a save took ", int(save_us), " us, delays up to ", max_delay_us, " us: ", mid_write,
          " landed mid-write, ", changed, " after a completed save changed the file");
  // The test only proves something if the kills hit saves in flight and saves completed between them.
  CHECK(mid_write >= 5);
  CHECK(changed >= 5);
}

TEST_CASE("serialize: a save removes the temporary files that killed saves left behind") {
  // A process killed mid-save (SIGKILL, the OOM killer, a power cut) leaves path.tmp.<its pid>,
  // a full-size copy of the checkpoint. Each run has a new pid, so without cleanup every crash
  // adds one: a folder of 1 GB checkpoints fills the disk after a few crashes. A save should
  // remove the temporaries of processes that no longer exist (the only ones that can be stale).
  TempDir tmp("stale_temp");
  const std::string path = tmp.file("ckpt.safetensors");
  const pid_t dead = ::fork();  // a pid that certainly belonged to a process that is gone
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  const std::string stale = path + ".tmp." + std::to_string(dead);
  write_bytes(stale, "half a checkpoint");
  save_safetensors(path, {{"v", tensor<float>({1, 2})}});
  CHECK(load_safetensors(path)[0].second.to_vector<float>() == std::vector<float>{1, 2});
  CHECK_FALSE(fs::exists(stale));
}
