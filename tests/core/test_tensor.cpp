// The tensor core: creation, metadata, conversions, devices, printing, raw views, broadcasting.
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("tensor: creation and metadata") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.strides() == Shape{3, 1});
  CHECK(z.dtype() == DType::f32);
  CHECK(z.device() == Device::cpu());
  CHECK(z.numel() == 6);
  CHECK(z.ndim() == 2);
  CHECK(z.size(-1) == 3);
  CHECK(z.stride(0) == 3);
  CHECK(z.nbytes() == 24);
  CHECK(z.is_contiguous());
  CHECK(z.is_leaf());
  CHECK_FALSE(z.requires_grad());
  check_close(z, {0, 0, 0, 0, 0, 0});
  check_close(ones({2, 2}, DType::f64), {1, 1, 1, 1});
  CHECK(ones({2}, DType::i64).to_vector<int64_t>() == std::vector<int64_t>{1, 1});
  CHECK(ones({3}, DType::b8).to_vector<int>() == std::vector<int>{1, 1, 1});
  check_close(full({2}, 2.5, DType::f64), {2.5, 2.5});
  CHECK(full({2}, 2.5, DType::f64).dtype() == DType::f64);
  CHECK(zeros_like(full({4, 1}, 3.0, DType::f64)).shape() == Shape{4, 1});
  CHECK(ones_like(full({4, 1}, 3.0, DType::f64)).dtype() == DType::f64);
  CHECK(empty_like(z).shape() == z.shape());

  Tensor s = scalar_tensor(-1.5, DType::f64);
  CHECK(s.ndim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.item<double>() == -1.5);

  Tensor e = zeros({3, 0});  // an empty tensor is valid (and contiguous)
  CHECK(e.numel() == 0);
  CHECK(e.is_contiguous());
  CHECK(e.to_vector<float>().empty());
}

TEST_CASE("tensor: arange") {
  // [start, end) in steps of step, as torch.arange: ceil((end - start) / step) elements
  CHECK(arange(0, 5, 2).to_vector<int64_t>() == std::vector<int64_t>{0, 2, 4});
  CHECK(arange(5.0).dtype() == DType::i64);
  CHECK(arange(5.0).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(arange(5, 0, -2).to_vector<int64_t>() == std::vector<int64_t>{5, 3, 1});  // negative step
  CHECK(arange(3, 3).numel() == 0);
  Tensor f = arange(0, 1, 0.25, DType::f32);
  CHECK(f.dtype() == DType::f32);
  check_close(f, {0, 0.25, 0.5, 0.75});
  Tensor d = arange(1, -0.5, -0.5, DType::f64);
  CHECK(d.dtype() == DType::f64);
  check_close(d, {1, 0.5, 0});
  AG_CHECK_ERROR(arange(0, 5, 0), "arange", "step must be nonzero");
  AG_CHECK_ERROR(arange(0, 5, -1), "arange", "cannot reach end 5");
  AG_CHECK_ERROR(arange(0, INFINITY), "arange", "finite");
  AG_CHECK_ERROR(arange(0, 3, 1, DType::b8), "arange", "b8");
}

TEST_CASE("tensor: from_vector and tensor()") {
  Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  CHECK(a.shape() == Shape{2, 3});
  CHECK(a.dtype() == DType::f32);
  CHECK(a.to_vector<float>() == std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor b = from_vector(std::vector<int64_t>{7, -8});
  CHECK(b.shape() == Shape{2});
  CHECK(b.dtype() == DType::i64);
  CHECK(b.to_vector<int64_t>() == std::vector<int64_t>{7, -8});
  CHECK(from_vector(std::vector<double>{0.5}).dtype() == DType::f64);

  CHECK(tensor({1.f, 2.f}).dtype() == DType::f32);
  CHECK(tensor({1, 2, 3}).dtype() == DType::f32);  // plain integer literals make f32
  check_close(tensor({1, 2, 3}), {1, 2, 3});
  Tensor t = tensor<double>({1, 2, 3, 4}, {2, 2});
  CHECK(t.dtype() == DType::f64);
  CHECK(t.shape() == Shape{2, 2});
  CHECK(tensor<int64_t>({4, 5}).dtype() == DType::i64);
  Tensor m = tensor<bool>({true, false, true});
  CHECK(m.dtype() == DType::b8);
  CHECK(m.to_vector<int>() == std::vector<int>{1, 0, 1});
}

TEST_CASE("tensor: shape errors") {
  AG_CHECK_ERROR(zeros({2, -1}), "negative dimension", "[2,-1]");
  AG_CHECK_ERROR(empty({-3}), "empty", "negative dimension");
  AG_CHECK_ERROR(from_vector(std::vector<float>{1, 2, 3}, Shape{2, 2}), "from_vector", "3 values", "[2,2]",
                 "4 elements");
  AG_CHECK_ERROR(tensor({1.f, 2.f, 3.f}, {2, 2}), "from_vector", "[2,2]");
  AG_CHECK_ERROR(zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}), "at most 8 dimensions");
  AG_CHECK_ERROR(zeros({2, 3}).size(2), "size", "dim 2 is out of range", "2 dims");
  AG_CHECK_ERROR(zeros({2, 3}).stride(-3), "stride", "dim -3 is out of range");
  AG_CHECK_ERROR(Tensor().shape(), "undefined tensor");
  AG_CHECK_ERROR(zeros({2}).data<double>(), "data", "f32", "f64");
}

TEST_CASE("tensor: item and to_vector conversions") {
  Tensor t = tensor({1.75f, -2.5f, 3.f, 0.f}, {2, 2});
  CHECK(t.to_vector<double>() == std::vector<double>{1.75, -2.5, 3, 0});
  CHECK(t.to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3, 0});  // C++ truncation toward 0
  CHECK(t.to_vector<int>() == std::vector<int>{1, -2, 3, 0});
  CHECK(t.to_vector<uint8_t>() == std::vector<uint8_t>{1, 254, 3, 0});  // -2.5 -> -2 -> 256 - 2
  // NaN and values beyond int64 are defined too (a plain cast is undefined behaviour): 0 and the ends
  const float inf = INFINITY;
  CHECK(tensor({NAN, 1e30f, -1e30f, -inf}).to_vector<int64_t>() ==
        std::vector<int64_t>{0, INT64_MAX, INT64_MIN, INT64_MIN});
  CHECK(scalar_tensor(NAN, DType::f64).item<int>() == 0);
  CHECK(scalar_tensor(inf, DType::f64).item<int64_t>() == INT64_MAX);
  // to_vector reads in row-major order of the *view*, not of the storage
  CHECK(t.transpose(0, 1).to_vector<float>() == std::vector<float>{1.75f, 3.f, -2.5f, 0.f});
  CHECK(t.select(1, 1).to_vector<float>() == std::vector<float>{-2.5f, 0.f});

  CHECK(scalar_tensor(2.75, DType::f64).item<float>() == 2.75f);
  CHECK(scalar_tensor(2.75, DType::f64).item<int64_t>() == 2);
  CHECK(scalar_tensor(-3, DType::i64).item<double>() == -3.0);
  CHECK(scalar_tensor(1, DType::b8).item<bool>() == true);
  CHECK(tensor({4.5f}).item<double>() == 4.5);            // one element of any rank
  CHECK(tensor({4.5f}, {1, 1}).item<int>() == 4);
  CHECK(t.select(0, 1).select(0, 0).item<float>() == 3.f);  // offset views
  AG_CHECK_ERROR(t.item<float>(), "item", "one element", "[2,2]");
  AG_CHECK_ERROR(zeros({0}).item<float>(), "item", "[0]");
}

TEST_CASE("tensor: Device::parse") {
  CHECK(Device::parse("cpu") == Device::cpu());
  CHECK(Device::parse("cuda") == Device::cuda(0));
  CHECK(Device::parse("cuda:0") == Device::cuda(0));
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cuda:3").index == 3);
  CHECK(Device::parse("cuda:12").is_cuda());
  CHECK(Device::cuda(2).str() == "cuda:2");
  CHECK(Device::cpu().str() == "cpu");
  for (const char* bad : {"", "gpu", "CPU", "cuda:", "cuda:-1", "cuda:+1", "cuda: 1", "cuda:1x", "cuda:x",
                          "cuda1", " cpu", "cuda:99999999999"})
    AG_CHECK_ERROR(Device::parse(bad), "device: cannot parse", "expected cpu, cuda or cuda:N");
  AG_CHECK_ERROR(Device::parse("tpu"), "'tpu'");
}

TEST_CASE("tensor: fmt formatting") {
  // PyTorch's layout: 4 decimals, columns right-aligned to the widest cell, rows indented under
  // the first bracket.
  Tensor a = tensor({1.f, -2.5f, 0.125f, 3.f}, {2, 2});
  CHECK(fmt::format("{}", a) ==
        "tensor([[ 1.0000, -2.5000],\n"
        "        [ 0.1250,  3.0000]], shape=[2,2], dtype=f32, device=cpu)");
  CHECK(fmt::format("{}", tensor<int64_t>({1, -20, 300})) ==
        "tensor([  1, -20, 300], shape=[3], dtype=i64, device=cpu)");
  // i64 is printed exactly (not through a double): 2^53 + 1
  CHECK(fmt::format("{}", tensor<int64_t>({9007199254740993})) ==
        "tensor([9007199254740993], shape=[1], dtype=i64, device=cpu)");
  CHECK(fmt::format("{}", tensor<bool>({true, false})) == "tensor([ True, False], shape=[2], dtype=b8, device=cpu)");
  CHECK(fmt::format("{}", scalar_tensor(2.5)) == "tensor(2.5000, shape=[], dtype=f32, device=cpu)");
  CHECK(fmt::format("{}", tensor<double>({1e-5, 1})) ==
        "tensor([1.0000e-05, 1.0000e+00], shape=[2], dtype=f64, device=cpu)");
  CHECK(fmt::format("{}", tensor({NAN, -INFINITY, 1.f})) ==
        "tensor([   nan,   -inf, 1.0000], shape=[3], dtype=f32, device=cpu)");
  CHECK(fmt::format("{}", zeros({0})) == "tensor([], shape=[0], dtype=f32, device=cpu)");
  CHECK(fmt::format("{}", arange(8.0).reshape({2, 2, 2})) ==
        "tensor([[[0, 1],\n"
        "         [2, 3]],\n"
        "\n"
        "        [[4, 5],\n"
        "         [6, 7]]], shape=[2,2,2], dtype=i64, device=cpu)");
  Tensor w = leaf64({1}, 3);
  CHECK(fmt::format("{}", w).find(", requires_grad)") != std::string::npos);
  CHECK(fmt::format("{}", Tensor()) == "tensor(undefined)");

  // more than 1000 elements: the first and last 3 of each dim around "..."
  Tensor big = arange(0, 2000, 1, DType::f32);
  CHECK(fmt::format("{}", big) ==
        "tensor([   0.0000,    1.0000,    2.0000, ..., 1997.0000, 1998.0000, 1999.0000], shape=[2000], "
        "dtype=f32, device=cpu)");
  std::string big2 = fmt::format("{}", arange(0, 2000, 1, DType::f64).reshape({40, 50}));
  CHECK(big2.find("[   0.0000,    1.0000,    2.0000, ...,   47.0000,   48.0000,   49.0000]") != std::string::npos);
  CHECK(big2.find("[1950.0000, 1951.0000, 1952.0000, ..., 1997.0000, 1998.0000, 1999.0000]]") != std::string::npos);
  CHECK(big2.find("\n        ...,\n") != std::string::npos);
  CHECK(big2.find("153.0000") == std::string::npos);  // row 3 is hidden
}

TEST_CASE("tensor: as_strided") {
  Tensor base = arange(0, 6, 1, DType::f32);
  Tensor v = as_strided(base, {2, 2}, {1, 2}, 1);  // v[i][j] = base[1 + i + 2j]
  check_close(v, {1, 3, 2, 4});
  CHECK_FALSE(v.is_contiguous());
  CHECK(v.impl().storage == base.impl().storage);
  CHECK(as_strided(base, {3, 0}, {100, 100}, 50).numel() == 0);  // an empty view reaches nothing
  AG_CHECK_ERROR(as_strided(base, {2, 3}, {3, 1}, 1), "as_strided", "[2,3]", "offset 1", "storage of 6 elements");
  AG_CHECK_ERROR(as_strided(base, {7}, {1}, 0), "as_strided", "reaches outside");
  AG_CHECK_ERROR(as_strided(base, {2}, {1}, -1), "as_strided", "reaches outside");
  AG_CHECK_ERROR(as_strided(base, {2}, {1, 1}, 0), "as_strided", "differ in rank");
  AG_CHECK_ERROR(as_strided(base, {-2}, {1}, 0), "as_strided", "negative dimension");
}

TEST_CASE("tensor: broadcast_shapes") {
  CHECK(broadcast_shapes("t", {3, 1}, {1, 4}) == Shape{3, 4});
  CHECK(broadcast_shapes("t", {4}, {2, 3, 4}) == Shape{2, 3, 4});
  CHECK(broadcast_shapes("t", {}, {2, 1}) == Shape{2, 1});
  CHECK(broadcast_shapes("t", {0, 1}, {1, 5}) == Shape{0, 5});
  AG_CHECK_ERROR(broadcast_shapes("myop", {2, 3}, {4, 3}), "myop", "[2,3]", "[4,3]", "cannot be broadcast");
  AG_CHECK_ERROR(broadcast_shapes("add", {3}, {2, 4}), "add", "[3]", "[2,4]", "3 vs 4");
}

TEST_CASE("tensor: empty tensors go through every elementwise path") {
  Tensor e = zeros({3, 0});
  CHECK(add(e, e).shape() == Shape{3, 0});
  CHECK(add(e.transpose(0, 1), ones({1, 3})).shape() == Shape{0, 3});  // strided + broadcast
  CHECK(exp(e.transpose(0, 1)).numel() == 0);
  CHECK(e.transpose(0, 1).contiguous().shape() == Shape{0, 3});
  CHECK(sum(e).item<float>() == 0.f);
  CHECK(sum(e, {1}).to_vector<float>() == std::vector<float>{0, 0, 0});
  Tensor dst = zeros({0, 3});
  dst.copy_(e.transpose(0, 1));
  CHECK(dst.numel() == 0);
}
