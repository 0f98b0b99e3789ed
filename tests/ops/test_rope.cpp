// rope and ALiBi attention (autograd/ops.h). Reference values: tools/make_positions_reference.py
// (PyTorch 1.13 in f64, rope written as the open models' code writes it: rotate_half for the
// default layout, complex multiplication for the interleaved one; ALiBi with its bias as an
// explicit tensor and the paper's get_slopes), pasted below with 9 significant digits and compared
// in f64 at 1e-8.
#include <cmath>

#include "nn/positional.h"
#include "tests/helpers.h"

using namespace ag;
using namespace ag::test;

TEST_CASE("rope: by hand, a pair turns by p base^(-2k/D)") {
  // D 2: one pair, angle = position (k = 0); x = (1, 0) at positions 0, 1, 2 becomes (cos p, sin p)
  const Tensor x = tensor<double>({1, 0, 1, 0, 1, 0}, {3, 2});
  const std::vector<double> y = rope(x).to_vector<double>();
  for (int p = 0; p < 3; ++p) {
    CHECK(y[size_t(2 * p)] == doctest::Approx(std::cos(p)).epsilon(1e-15));
    CHECK(y[size_t(2 * p + 1)] == doctest::Approx(std::sin(p)).epsilon(1e-15));
  }
  // D 4, rotate-half: pairs (x0, x2) at angle p and (x1, x3) at angle p / 100 (base 1e4: 1e4^(-1/2))
  const Tensor z = tensor<double>({1, 2, 3, 4}, {1, 4});
  const std::vector<double> r = rope(z, /*offset=*/7).to_vector<double>();
  const double a = 7, b = 0.07;
  check_close(from_vector<double>(r, {4}),
              tensor<double>({1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
                               1 * std::sin(a) + 3 * std::cos(a), 2 * std::sin(b) + 4 * std::cos(b)}, {4}),
              1e-15, 1e-15);
  // interleaved: pairs (x0, x1) at angle p and (x2, x3) at p / 100
  check_close(rope(z, 7, /*interleaved=*/true).reshape({4}),
              tensor<double>({1 * std::cos(a) - 2 * std::sin(a), 1 * std::sin(a) + 2 * std::cos(a),
                               3 * std::cos(b) - 4 * std::sin(b), 3 * std::sin(b) + 4 * std::cos(b)}, {4}),
              1e-15, 1e-15);
}

TEST_CASE("rope: matches PyTorch (rotate-half and interleaved), values and gradients") {
  const std::vector<double> half = {
      -0.423583057, 0.371233922, 0.232475381, -0.344676524, -0.125301339, 0.325369976, 0.511529878, 0.157827779,
      -0.382373169, -0.0521346546, 0.227839581, 0.491560493, 0.1673847, -0.598543717, -0.289274775, 0.305724783,
      0.099615069, -0.308034559, -0.481060545, -0.206180617, 0.592550278, 0.281394832, -0.194092057, -0.500703035,
      -0.492263246, 0.387621733, 0.319046365, -0.259414728, -0.0339027792, 0.212264742, 0.498466319, 0.256076191,
      -0.286032815, -0.13054787, 0.130627843, 0.498023538, 0.248966522, -0.591123242, -0.373543265, 0.213478379,
      0.17276249, -0.258197439, -0.459757864, -0.298600572, 0.552625832, 0.38948885, -0.0871298816, -0.495631517};
  const std::vector<double> half_grad = {
      0.159184972, 0.552059517, -0.206366866, -0.492782836, 0.391668816, 0.23283115, 0.303151501, -0.310075296,
      -0.33261415, -0.174590947, 0.504705668, 0.201357187, -0.502112588, -0.373177997, 0.141648181, 0.497215711,
      0.385778776, -0.350604908, -0.367561809, 0.266927829, 0.298097634, 0.278533581, -0.460472244, -0.248545066,
      0.241440662, 0.584074929, -0.101285692, -0.500901611, 0.296787922, 0.160617168, 0.378091271, -0.219156607,
      -0.384157156, -0.29337026, 0.472330466, 0.295065202, -0.437652887, -0.356024902, 0.0388031113, 0.493602709,
      0.476672998, -0.236955886, -0.436644652, 0.169731415, 0.24567057, 0.32321502, -0.418275615, -0.335321001};
  const std::vector<double> inter = {
      0.461989667, 0.13666251, 0.426143075, 0.0556153625, -0.454581301, 0.00693000139, 0.49117177, 0.182971135,
      -0.5038822, -0.250163225, -0.408588961, 0.347303718, 0.175113452, -0.433654066, -0.31910097, 0.285131356,
      0.385796804, 0.264152324, 0.164237347, -0.510384726, 0.235356104, 0.510978684, -0.126592556, -0.508736475,
      0.39339473, 0.228086289, 0.393594025, 0.172479798, -0.469767172, -0.106374173, 0.469193272, 0.279861407,
      -0.453862994, -0.327757217, -0.44459089, 0.25158994, 0.263236522, -0.357153548, -0.392028838, 0.188556359,
      0.336804099, 0.364385555, 0.25883768, -0.490117518, 0.145425298, 0.535020858, -0.021991057, -0.496070639};
  const std::vector<double> inter_grad = {
      -0.238190666, 0.509217662, -0.536566162, -0.0485399168, 0.0634894337, 0.466536218, 0.277358303, -0.326010324,
      -0.459969516, -0.0644745953, 0.336690705, -0.413903217, -0.483041584, -0.288851068, 0.199648302, 0.48787729,
      -0.22244736, -0.399851237, 0.237343149, 0.357361299, 0.450995832, -0.159471438, -0.500308469, -0.214042177,
      -0.317521861, 0.462136255, -0.494326126, -0.140906661, -0.0503172795, 0.443166088, 0.361662456, -0.239021138,
      -0.460096615, -0.176698102, 0.418401728, -0.361063201, -0.423505227, -0.36009557, 0.0950422944, 0.490763874,
      -0.106622081, -0.423669528, 0.134658371, 0.420205462, 0.503277562, -0.0635198761, -0.46891406, -0.30376976};
  const Shape shape{1, 2, 3, 8};
  for (bool interleaved : {false, true}) {
    CAPTURE(interleaved);
    Tensor x = vals(shape, 0.0, DType::f64).set_requires_grad();
    const Tensor y = interleaved ? rope(x, 5, true, 500) : rope(x, 5);
    check_close(y, from_vector<double>(interleaved ? inter : half, shape), 1e-8, 1e-8);
    sum(mul(y, vals(shape, 1.0, DType::f64))).backward();
    check_close(x.grad(), from_vector<double>(interleaved ? inter_grad : half_grad, shape), 1e-8, 1e-8);
    // f32: the angles' cos and sin are rounded to f32, the rest as in f64 to f32 rounding
    check_close(rope(vals(shape, 0.0), 5, interleaved, interleaved ? 500 : 10000),
                from_vector<double>(interleaved ? inter : half, shape).to(DType::f32), 1e-6, 1e-6);
  }
}

TEST_CASE("rope: gradcheck, strided input, scores depend on the distance only, errors") {
  for (bool interleaved : {false, true})
    expect_gradcheck([&](const std::vector<Tensor>& in) { return rope(in[0], 3, interleaved); },
                     {leaf64({2, 3, 5, 6}, 1)});
  // a transposed (non-contiguous) view: read as its values
  const Tensor t = leaf64({2, 6, 5}, 2);
  check_close(rope(t.transpose(1, 2)), rope(t.transpose(1, 2).contiguous()), 0, 0);
  // q at position p and k at position r: rope(q) . rope(k) depends on p - r only
  const Tensor q = leaf64({1, 8}, 3), k = leaf64({1, 8}, 4);
  auto score = [&](int64_t p, int64_t r) {
    return sum(mul(rope(q, p), rope(k, r))).item<double>();
  };
  CHECK(score(10, 4) == doctest::Approx(score(6, 0)).epsilon(1e-12));
  CHECK(score(1000, 997) == doctest::Approx(score(3, 0)).epsilon(1e-10));
  CHECK(std::abs(score(3, 0) - score(4, 0)) > 1e-3);  // it does depend on the distance
  AG_CHECK_ERROR(rope(zeros({2, 3, 5})), "rope", "D even", "[2,3,5]");
  AG_CHECK_ERROR(rope(zeros({4})), "rope", "[..., T, D]");
  AG_CHECK_ERROR(rope(zeros({2, 4}), -1), "rope", "offset", "-1");
  AG_CHECK_ERROR(rope(zeros({2, 4}), 0, false, 1.0), "rope", "base", "1");
  AG_CHECK_ERROR(rope(zeros({2, 4}, DType::i64)), "rope", "i64");
}

TEST_CASE("alibi_slopes: the paper's slopes for powers of two and for other head counts") {
  check_close(nn::alibi_slopes(1), tensor<float>({0.00390625}, {1}), 0, 1e-7);
  check_close(nn::alibi_slopes(3), tensor<float>({0.0625, 0.00390625, 0.25}, {3}), 0, 1e-7);
  check_close(nn::alibi_slopes(4), tensor<float>({0.25, 0.0625, 0.015625, 0.00390625}, {4}), 0, 1e-7);
  check_close(nn::alibi_slopes(6), tensor<float>({0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}, {6}), 0, 1e-7);
  check_close(nn::alibi_slopes(8), tensor<float>({0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625}, {8}), 0, 1e-7);
  check_close(nn::alibi_slopes(12), tensor<float>({0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625, 0.707106781, 0.353553391, 0.176776695, 0.0883883476}, {12}), 0, 1e-7);
  AG_CHECK_ERROR(nn::alibi_slopes(0), "alibi_slopes", "0");
}

TEST_CASE("attention: ALiBi biases match PyTorch, fused and composed, causal and not") {
  const std::vector<double> plain = {
    0.10433907, -0.0559492396, -0.134271782, -0.0158858493, 0.14213854, 0.00608918498, -0.138880841, -0.0803901094,
    0.118101772, 0.0742790301, -0.0783626652, -0.116202872, 0.0115004619, -0.0246383506, -0.0246819218, 0.0114335803,
    -0.0367944203, -0.0689279812, -8.18881289e-05, 0.0688841712, -0.00613764173, -0.103900688, -0.0494489832,
    0.0774455983, -0.01454293, -0.17348799, -0.078272738, 0.131612258, 0.10210262, -0.124465053, -0.168691132,
    0.0342156924, 0.116616904, -0.0492064379, -0.142942233, -0.0272673217};
  const std::vector<double> causal = {
    0.0996170285, -0.278195529, -0.248450985, 0.145274835, 0.198065978, -0.0681699305, -0.234536731, -0.0573066713,
    0.118101772, 0.0742790301, -0.0783626652, -0.116202872, -0.239716215, -0.2738929, 0.0931841549, 0.323746205,
    -0.106902717, -0.201599171, -0.000952366787, 0.201089657, -0.00613764173, -0.103900688, -0.0494489832,
    0.0774455983, -0.304048658, -0.229782258, 0.181115688, 0.326678727, -0.0353169829, -0.243098644, -0.0947402224,
    0.192412847, 0.116616904, -0.0492064379, -0.142942233, -0.0272673217};
  // B 1, H 3, Tq 3 at the last 3 of Tk 5 positions, d 4, scale 1/2
  const Tensor q = vals({1, 3, 3, 4}, 2.0, DType::f64), k = vals({1, 3, 5, 4}, 3.0, DType::f64),
               v = vals({1, 3, 5, 4}, 4.0, DType::f64);
  for (bool is_causal : {false, true})
    for (bool composed : {false, true}) {
      CAPTURE(is_causal);
      CAPTURE(composed);
      SdpaOptions o;
      o.alibi_slopes = nn::alibi_slopes(3);
      o.causal = is_causal, o.return_weights = composed;
      check_close(scaled_dot_product_attention(q, k, v, o).out,
                  from_vector<double>(is_causal ? causal : plain, {1, 3, 3, 4}), 1e-8, 1e-8);
    }
}

TEST_CASE("attention: ALiBi fused equals composed with every mask, across tiles, and gradchecks") {
  Generator g(5);
  // T 70 crosses the CPU kernel's query (32) and key tiles; slopes steep enough to matter
  const Tensor slopes = tensor<float>({0.5f, 0.125f, 1.0f / 32, 1.0f / 128}, {4});
  std::vector<SdpaOptions> masks(4);
  masks[1].causal = true;
  masks[2].window = 5;
  masks[3].key_padding_lengths = from_vector<int64_t>({70, 41}, {2});
  for (SdpaOptions m : masks) {
    m.alibi_slopes = slopes;
    Tensor q = randn({2, 4, 70, 8}, DType::f64, &g).set_requires_grad(),
           k = randn({2, 4, 70, 8}, DType::f64, &g).set_requires_grad(),
           v = randn({2, 4, 70, 8}, DType::f64, &g).set_requires_grad();
    const Tensor q2 = q.detach().set_requires_grad(), k2 = k.detach().set_requires_grad(),
                 v2 = v.detach().set_requires_grad();
    SdpaOptions mc = m;
    mc.return_weights = true;
    const Tensor y = scaled_dot_product_attention(q, k, v, m).out, ref = scaled_dot_product_attention(q2, k2, v2, mc).out;
    check_close(y, ref, 1e-12, 1e-12);
    const Tensor r = randn(y.shape(), DType::f64, &g);
    sum(mul(y, r)).backward();
    sum(mul(ref, r)).backward();
    check_close(q.grad(), q2.grad(), 1e-11, 1e-11);
    check_close(k.grad(), k2.grad(), 1e-11, 1e-11);
    check_close(v.grad(), v2.grad(), 1e-11, 1e-11);
  }
  // the bias changes the output (a test that could not fail otherwise)
  const Tensor q = randn({1, 4, 6, 8}, DType::f64, &g), k = randn({1, 4, 6, 8}, DType::f64, &g);
  SdpaOptions with;
  with.alibi_slopes = slopes;
  CHECK(max(abs(scaled_dot_product_attention(q, k, k, with).out - scaled_dot_product_attention(q, k, k).out))
            .item<double>() > 1e-3);
  // gradcheck through the fused kernel, grouped-query heads and a KV-cache-like Tq < Tk included
  SdpaOptions o;
  o.alibi_slopes = tensor<float>({0.25f, 0.0625f}, {2}), o.causal = true;
  expect_gradcheck([o](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], o).out; },
                   {leaf64({1, 2, 40, 3}, 1), leaf64({1, 2, 45, 3}, 2), leaf64({1, 2, 45, 2}, 3)});
  o.enable_gqa = true, o.causal = false;
  expect_gradcheck([o](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], o).out; },
                   {leaf64({2, 2, 5, 3}, 4), leaf64({2, 1, 7, 3}, 5), leaf64({2, 1, 7, 2}, 6)});
  AG_CHECK_ERROR(
      [&] {
        SdpaOptions bad;
        bad.alibi_slopes = tensor<float>({0.5f}, {1});
        scaled_dot_product_attention(q, k, k, bad);
      }(),
      "alibi_slopes must be f32 of shape [4]", "[1]");
  AG_CHECK_ERROR(
      [&] {
        SdpaOptions bad;
        bad.alibi_slopes = tensor<float>({0.5f, NAN, 0.1f, 0.1f}, {4});
        scaled_dot_product_attention(q, k, k, bad);
      }(),
      "alibi_slopes holds nan");
}
