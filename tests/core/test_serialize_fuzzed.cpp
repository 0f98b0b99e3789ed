// Regressions from fuzzing the safetensors reader (tests/fuzz/fuzz_safetensors.cpp): each case is
// an input the fuzzer's round-trip check or sanitizers flagged, now loading correctly or raising
// an ag::Error that names the file and the offending values.
#include <cstring>

#include "core/serialize.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

namespace {
// A file from its header text and data bytes, as the spec lays it out.
std::string file_from(const std::string& header, const std::string& data) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);  // little-endian (serialize.cpp static_asserts the host is)
  return s + header + data;
}
std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& ts) {
  std::vector<std::string> out;
  for (const auto& [n, t] : ts) out.push_back(n);
  return out;
}
}  // namespace

TEST_CASE("serialize fuzzed: empty tensors keep the order they were saved in") {
  // All empty tensors sit at one offset, so the sort by offset cannot order them; read in the
  // order of nlohmann::json's sorted keys ("a" before "b"), they would break the promise of
  // load_safetensors and the fuzzer's save + load round trip.
  TempDir tmp("fuzzed-order");
  const std::string path = tmp.file("e.safetensors");
  save_safetensors(path, {{"z", zeros({0})}, {"b", zeros({2, 0})}, {"w", ones({1})}, {"a", zeros({0, 3})}});
  CHECK(names_of(load_safetensors(path)) == std::vector<std::string>{"z", "b", "w", "a"});
  // the same from a header written by hand, keys not sorted
  write_bytes(tmp.file("h.safetensors"),
              file_from(R"({"y":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                        R"("x":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                        R"("c":{"dtype":"BOOL","shape":[0,5],"data_offsets":[0,0]}})",
                        std::string(8, '\0')));
  CHECK(names_of(load_safetensors(tmp.file("h.safetensors"))) == std::vector<std::string>{"y", "c", "x"});
}

TEST_CASE("serialize fuzzed: a duplicate key inside an entry or the metadata is an error") {
  // {"dtype": "F64", "dtype": "F32"}: nlohmann kept the last value, so which dtype a file meant
  // depended on the parser; the spec's reference parser rejects it.
  TempDir tmp("fuzzed-dup");
  write_bytes(tmp.file("d.safetensors"),
              file_from(R"({"w":{"dtype":"F64","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')));
  AG_CHECK_ERROR(load_safetensors(tmp.file("d.safetensors")), "load_safetensors", "d.safetensors",
                 "duplicate key 'dtype' in 'w'");
  write_bytes(tmp.file("m.safetensors"), file_from(R"({"__metadata__":{"step":"1","step":"2"}})", ""));
  AG_CHECK_ERROR(load_safetensors(tmp.file("m.safetensors")), "load_safetensors", "m.safetensors",
                 "duplicate key 'step' in '__metadata__'");
  // the same keys in two different entries are fine
  write_bytes(tmp.file("ok.safetensors"),
              file_from(R"({"p":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("q":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"__metadata__":{"k":"v"}})",
                        std::string(8, '\0')));
  std::map<std::string, std::string> meta;
  CHECK(names_of(load_safetensors(tmp.file("ok.safetensors"), &meta)) == std::vector<std::string>{"p", "q"});
  CHECK(meta == std::map<std::string, std::string>{{"k", "v"}});
}
