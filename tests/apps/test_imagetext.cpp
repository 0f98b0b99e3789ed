// The image-text app's pieces (apps/imagetext) on tiny models and tiny synthetic scenes: caption
// tokens, scene composition (reproducible, pixels in their slots, sources kept apart), the config
// through a checkpoint, the training step main runs (forward_backward) on one process and on the
// ranks' slices, greedy generation with the KV cache against the uncached reference, the retrieval
// scorer against per-pair forwards, recall@k on hand-made matrices, the word-to-item share on
// hand-made attention weights, and the binary end to end: a run that learns, writes its files,
// resumes bit for bit, evaluates a checkpoint, refuses another app's, and exits 2 with one line for
// a bad option.
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "apps/imagetext/lib.h"
#include "autograd/ops.h"
#include "optim/adam.h"
#include "tests/apps/tiny_apps.h"
#include "tests/apps/usage_error.h"
#include "tests/helpers.h"
#include "training/checkpoint.h"

using namespace ag;
using namespace ag::apps;
using namespace ag::test;

namespace {

// n grey S x S items; item i has class labels[i] and every pixel equal to (i * 37 + 11) mod 251, so
// each item's pixels identify it.
data::ImageDataset items(int S, const std::vector<int64_t>& labels) {
  data::ImageDataset d;
  d.n = int64_t(labels.size()), d.channels = 1, d.height = S, d.width = S, d.num_classes = 10;
  d.labels = labels;
  for (size_t i = 0; i < labels.size(); ++i) d.images.insert(d.images.end(), size_t(S * S), uint8_t((i * 37 + 11) % 251));
  return d;
}

// A tiny model for scenes of 8x8 items: patch 4, d 16, 2 heads, 1 encoder and 2 decoder blocks.
ImageText tiny_model(const SceneConfig& sc, uint64_t seed) {
  ImageTextConfig m;
  m.patch = 4, m.d_model = 16, m.n_heads = 2, m.enc_layers = 1, m.dec_layers = 2, m.mlp_hidden = 32;
  fit_model_to_scenes(m, sc);
  Generator g(seed);
  return ImageText(m, &g);
}

SceneConfig tiny_scenes(const std::string& layout = "row") {
  SceneConfig sc;
  sc.layout = layout, sc.min_items = 1, sc.max_items = 3, sc.item_size = 8;
  return sc;
}

// The app at a tiny size on write_fashion_gz's 8x8 items (class i % 4, brightness 30 + 60 c).
std::vector<std::string> tiny_command(const Apps& apps, const std::string& out, int64_t steps,
                                      std::vector<std::string> more = {}) {
  std::vector<std::string> a = {std::string(ATTOGRAD_APP_DIR) + "/imagetext",
                                "--data-dir", apps.tmp.file("fashion"), "--out", apps.tmp.file(out),
                                "--steps", std::to_string(steps), "--eval-every", "40", "--log-every", "20",
                                "--quiet", "--threads", "1", "--batch", "16", "--lr", "3e-3",
                                "--patch", "4", "--d-model", "32", "--heads", "2", "--enc-layers", "1",
                                "--dec-layers", "1", "--mlp", "64", "--min-items", "1", "--max-items", "2",
                                "--val-images", "32", "--val-scenes", "32", "--test-scenes", "40",
                                "--retrieval-candidates", "20", "--attention-scenes", "2", "--eval-batch", "16",
                                "--peak-gflops", "10"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// Runs a command line; returns the exit status, stdout and stderr in the given files.
int run_command(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  std::string cmd;
  for (const auto& s : args) cmd += "'" + s + "' ";
  cmd += "> '" + out + "' 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("imagetext: caption words, tokens and text") {
  CHECK(caption_vocab_size() == 13);
  const std::vector<int64_t> labels = {7, 8, 3};
  CHECK(caption_text(labels) == "sneaker, bag, dress");
  // ids: 3 + class
  CHECK(encode_caption("sneaker, bag, dress") == std::vector<int64_t>{10, 11, 6});
  CHECK(encode_caption("t-shirt boot") == std::vector<int64_t>{3, 12});
  // <bos> and <pad> skipped, <eos> ends the caption
  const std::vector<int64_t> ids = {kBos, 10, kPad, 11, kEos, 6};
  CHECK(decode_caption(ids) == "sneaker, bag");
  CHECK(caption_words_of(ids) == std::vector<int64_t>{10, 11});
  CHECK(decode_caption(std::vector<int64_t>{kEos}).empty());
  AG_CHECK_ERROR(encode_caption("sneaker, hat"), "imagetext", "'hat'", "not a word");
  Scene s;
  s.labels = {7, 8};
  CHECK(caption_tokens(s) == std::vector<int64_t>{kBos, 10, 11, kEos});
}

TEST_CASE("imagetext: scenes are a function of seed, split and index, with every item count") {
  std::vector<int64_t> labels;
  for (int i = 0; i < 50; ++i) labels.push_back(i % 10);
  const data::ImageDataset src = items(8, labels);
  SceneConfig sc = tiny_scenes();
  sc.min_items = 2, sc.max_items = 4;
  const std::vector<Scene> a = compose_scenes(src, sc, 7, SceneSplit::train, 100, 300);
  const std::vector<Scene> b = compose_scenes(src, sc, 7, SceneSplit::train, 100, 300);
  std::set<size_t> counts;
  int same_as_other_seed = 0, same_as_other_split = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].images == b[i].images);  // reproducible
    counts.insert(a[i].images.size());
    REQUIRE(a[i].images.size() == a[i].labels.size());
    for (size_t k = 0; k < a[i].images.size(); ++k) {
      REQUIRE(a[i].images[k] >= 0);
      REQUIRE(a[i].images[k] < src.size());
      CHECK(a[i].labels[k] == src.labels[size_t(a[i].images[k])]);
    }
    // scene 100 + i on its own equals the i-th of the run of scenes
    if (i % 50 == 0) CHECK(compose_scene(src, sc, 7, SceneSplit::train, 100 + i).images == a[i].images);
    same_as_other_seed += compose_scene(src, sc, 8, SceneSplit::train, 100 + i).images == a[i].images;
    same_as_other_split += compose_scene(src, sc, 7, SceneSplit::test, 100 + i).images == a[i].images;
  }
  CHECK(counts == std::set<size_t>{2, 3, 4});
  // another seed or split draws other scenes: equal ones only by chance (<= 1/(3 * 50^2) each)
  CHECK(same_as_other_seed <= 2);
  CHECK(same_as_other_split <= 2);
}

TEST_CASE("imagetext: scene pixels land in their slots, blank elsewhere, and the batch's captions") {
  const data::ImageDataset src = items(8, {7, 8, 3, 0});
  for (const std::string layout : {"row", "grid"}) {
    INFO("layout " << layout);
    const SceneConfig sc = tiny_scenes(layout);
    Scene s;
    s.images = {2, 0}, s.labels = {3, 7};
    const std::vector<uint8_t> px = scene_pixels(src, sc, s);
    const int64_t H = sc.height(), W = sc.width();
    CHECK(H == (layout == "row" ? 8 : 16));
    CHECK(W == (layout == "row" ? 24 : 16));
    REQUIRE(int64_t(px.size()) == H * W);
    // slot 0 at (0, 0) holds item 2 (pixel 85), slot 1 at (0, 8) holds item 0 (pixel 11); the rest is 0
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const uint8_t want = y < 8 && x < 8 ? 85 : y < 8 && x < 16 ? 11 : 0;
        REQUIRE(int(px[size_t(y * W + x)]) == int(want));
      }
    // patch 4: slots of each patch of the (H/4) x (W/4) grid
    const std::vector<int64_t> slot = patch_slots(sc, 4);
    if (layout == "row")
      CHECK(slot == std::vector<int64_t>{0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2});
    else
      CHECK(slot == std::vector<int64_t>{0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3});

    const data::Normalization norm{{0.25}, {0.5}};
    const std::vector<Scene> both = {s, Scene{{3}, {0}}};
    const SceneBatch b = make_scene_batch(src, sc, both, norm);
    CHECK(b.images.shape() == Shape{2, 1, H, W});
    // pixel 85 -> (85/255 - 0.25) / 0.5; a blank pixel -> -0.5
    CHECK(b.images.to_vector<double>()[0] == doctest::Approx((85.0 / 255 - 0.25) / 0.5).epsilon(1e-6));
    CHECK(b.images.to_vector<double>()[size_t(H * W - 1)] == doctest::Approx(-0.5));
    // T = max_items + 1 = 4 positions; the captions <bos> dress sneaker <eos> and <bos> t-shirt <eos>:
    // input without the last token, target without the first
    CHECK(b.input.to_vector<int64_t>() == std::vector<int64_t>{1, 6, 10, 0, 1, 3, 0, 0});
    CHECK(b.target.to_vector<int64_t>() == std::vector<int64_t>{6, 10, 2, -100, 3, 2, -100, -100});
    CHECK(b.words == 5);
  }
  SceneConfig grid = tiny_scenes("grid");
  grid.max_items = 5;
  AG_CHECK_ERROR(check_scene_config(grid), "--max-items 5", "at most 4");
}

TEST_CASE("imagetext: the three scene sources: validation held out of training, test scenes from test images") {
  Apps apps("imagetext_sources");  // 256 training and 64 test images of 8x8
  const ImageTextData d = load_imagetext_data(apps.tmp.file("fashion"), 40);
  CHECK(d.train.size() == 216);
  CHECK(d.val.size() == 40);
  CHECK(d.test.size() == 64);
  // no held-out image is left among the training images (the noise makes every image distinct);
  // images as strings of their 64 bytes
  auto bytes = [](const uint8_t* p, size_t n = 64) { return std::string(reinterpret_cast<const char*>(p), n); };
  std::set<std::string> train_images, test_images;
  for (int64_t i = 0; i < d.train.size(); ++i) train_images.insert(bytes(d.train.image(i)));
  for (int64_t i = 0; i < d.val.size(); ++i) CHECK(train_images.count(bytes(d.val.image(i))) == 0);
  // the pixels of a test scene's slots are test images
  for (int64_t i = 0; i < d.test.size(); ++i) test_images.insert(bytes(d.test.image(i)));
  const SceneConfig sc = tiny_scenes();
  for (const Scene& s : compose_scenes(d.test, sc, 3, SceneSplit::test, 0, 20)) {
    const std::vector<uint8_t> px = scene_pixels(d.test, sc, s);
    for (size_t k = 0; k < s.images.size(); ++k) {
      std::string item;
      for (size_t y = 0; y < 8; ++y) item += bytes(px.data() + y * 24 + 8 * k, 8);  // row y of slot k
      CHECK(test_images.count(item) == 1);
      CHECK(train_images.count(item) == 0);
    }
  }
  // a training step's scenes: the global batch cut into the ranks' slices
  ImageTextRunConfig c;
  c.scenes = sc;
  const std::vector<Scene> all = train_scenes(d.train, c, 6, 3);
  const std::vector<Scene> r1 = train_scenes(d.train, c, 6, 3, 1, 2);
  REQUIRE(all.size() == 6);
  REQUIRE(r1.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(r1[i].images == all[3 + i].images);
  CHECK(all[0].images == compose_scene(d.train, sc, c.scene_seed, SceneSplit::train, 18).images);
  AG_CHECK_ERROR(load_imagetext_data(apps.tmp.file("fashion"), 256), "--val-images 256", "no training sample");
  // -1: validation_size's 10% of the 256 training images
  CHECK(load_imagetext_data(apps.tmp.file("fashion"), -1).val.size() == 25);
}

TEST_CASE("imagetext: config round trip through a checkpoint's metadata, and the command-line checks") {
  ImageTextRunConfig c;
  c.scenes = tiny_scenes("grid");
  c.val_images = 17, c.val_scenes = 19, c.test_scenes = 23, c.scene_seed = 5, c.label_smoothing = 0.1;
  c.model.patch = 4, c.model.d_model = 16, c.model.n_heads = 2, c.model.enc_layers = 1, c.model.dec_layers = 2;
  c.model.mlp_hidden = 32, c.model.dropout = 0.25;
  fit_model_to_scenes(c.model, c.scenes);
  CHECK(c.model.image_h == 16);
  CHECK(c.model.image_w == 16);
  CHECK(c.model.max_len == 4);
  const nlohmann::json j = imagetext_config_to_json(c);
  TempDir dir("imagetext_config");
  ImageText model(c.model);
  optim::AdamW opt(model.parameters(), {});
  Generator gen(3);
  training::save_checkpoint(dir.file("c.safetensors"), model, opt, 7, gen, {{"config", j.dump()}});
  const CheckpointInfo info = read_checkpoint_info(dir.file("c.safetensors"));
  CHECK(info.step == 7);
  const ImageTextRunConfig back = imagetext_config_from_json(info.config);
  CHECK(imagetext_config_to_json(back) == j);
  CHECK(back.scenes.layout == "grid");
  CHECK(back.model.dropout == 0.25);
  nlohmann::json missing = j;
  missing.erase("patch");
  AG_CHECK_ERROR(imagetext_config_from_json(missing), "'patch'");
  nlohmann::json wrong = j;
  wrong["d_model"] = 1.5;
  AG_CHECK_ERROR(imagetext_config_from_json(wrong), "'d_model'", "integer");

  ImageTextRunConfig ok;
  validate_imagetext_config(ok);  // the defaults pass
  auto with = [&](auto change) {
    ImageTextRunConfig x;
    change(x);
    return [x] { validate_imagetext_config(x); };
  };
  check_usage_error(with([](auto& x) { x.model.n_heads = 3; }), {"--heads 3", "--d-model 64"});
  check_usage_error(with([](auto& x) { x.model.patch = 5; }), {"--patch 5", "28x28"});
  check_usage_error(with([](auto& x) { x.scenes.layout = "grid", x.scenes.max_items = 5; }),
                    {"--max-items 5", "grid", "at most 4"});
  check_usage_error(with([](auto& x) { x.scenes.min_items = 3, x.scenes.max_items = 2; }),
                    {"--min-items 3", "--max-items 2"});
  check_usage_error(with([](auto& x) { x.scenes.layout = "spiral"; }), {"--layout 'spiral'"});
  check_usage_error(with([](auto& x) { x.val_scenes = 0; }), {"--val-scenes 0"});
  check_usage_error(with([](auto& x) { x.val_images = 0; }), {"--val-images 0", "-1: 10%"});
  check_usage_error(with([](auto& x) { x.val_images = -2; }), {"--val-images -2"});
  check_usage_error(with([](auto& x) { x.label_smoothing = 1.0; }), {"--label-smoothing 1"});
}

TEST_CASE("imagetext: greedy captions through the KV caches (text only, or text and image) equal the uncached reference, the first token the argmax") {
  std::vector<int64_t> labels;
  for (int i = 0; i < 30; ++i) labels.push_back(i % 10);
  const data::ImageDataset src = items(8, labels);
  const SceneConfig sc = tiny_scenes();
  const std::vector<Scene> scenes = compose_scenes(src, sc, 1, SceneSplit::test, 0, 12);
  const SceneBatch b = make_scene_batch(src, sc, scenes, {{0.3}, {0.4}});
  for (uint64_t seed : {1, 2, 3}) {
    ImageText model = tiny_model(sc, seed);
    // a random model rarely says <eos> at once: scale the head so the argmax is sharp and varied
    {
      NoGradGuard ng;
      model.head->weight.mul_(20.0);
    }
    const auto cached = greedy_captions(model, b.images, CaptionCache::full);
    const auto uncached = greedy_captions(model, b.images, CaptionCache::none);
    REQUIRE(cached.size() == 12);
    CHECK(cached == uncached);
    CHECK(greedy_captions(model, b.images, CaptionCache::text_only) == uncached);
    // the first generated token is the argmax of one forward over <bos>
    NoGradGuard ng;
    model.eval();
    const Tensor logits = model.forward(b.images, full({12, 1}, double(kBos), DType::i64));  // (B, 1, V)
    const std::vector<int64_t> first = argmax(logits.reshape({12, -1}), 1).to_vector<int64_t>();
    for (size_t k = 0; k < 12; ++k) {
      REQUIRE(!cached[k].empty());
      CHECK(cached[k][0] == first[k]);
      // at most T = max_items + 1 tokens; only the last may be <eos>
      CHECK(cached[k].size() <= 4);
      for (size_t t = 0; t + 1 < cached[k].size(); ++t) CHECK(cached[k][t] != kEos);
    }
  }
}

TEST_CASE("imagetext: slices of a batch, each loss divided by half the global token count, average to the global mean") {
  std::vector<int64_t> labels;
  for (int i = 0; i < 20; ++i) labels.push_back(i % 10);
  const data::ImageDataset src = items(8, labels);
  const SceneConfig sc = tiny_scenes();  // 1 to 3 items: captions of 2 to 4 tokens
  const std::vector<Scene> scenes = compose_scenes(src, sc, 5, SceneSplit::train, 0, 8);
  const std::span<const Scene> all(scenes), first = all.subspan(0, 4), second = all.subspan(4, 4);
  REQUIRE(caption_token_count(first) != caption_token_count(second));  // slices of unequal token counts
  const data::Normalization norm{{0.3}, {0.4}};
  ImageText model = tiny_model(sc, 6);
  NoGradGuard ng;
  const SceneBatch b = make_scene_batch(src, sc, all, norm), b1 = make_scene_batch(src, sc, first, norm),
                   b2 = make_scene_batch(src, sc, second, norm);
  CHECK(b.words == caption_token_count(all));
  const double W = double(caption_token_count(all));
  const double global = caption_loss(model, b).item<double>();  // the mean over all W tokens
  CHECK(caption_loss(model, b, 0.0, W).item<double>() == doctest::Approx(global).epsilon(1e-6));
  const double halves =
      (caption_loss(model, b1, 0.0, W / 2).item<double>() + caption_loss(model, b2, 0.0, W / 2).item<double>()) / 2;
  CHECK(halves == doctest::Approx(global).epsilon(1e-6));
  // the mean of the slices' own means is another number
  const double means = (caption_loss(model, b1).item<double>() + caption_loss(model, b2).item<double>()) / 2;
  CHECK(std::abs(means - global) > 1e-4);
}

TEST_CASE("imagetext: forward_backward, the step main runs: the ranks' slices average to the global gradients") {
  Apps apps("imagetext_step");  // 256 training images of 8x8, 40 held out
  const ImageTextData d = load_imagetext_data(apps.tmp.file("fashion"), 40);
  ImageTextRunConfig c;
  c.scenes = tiny_scenes();
  ImageText model = tiny_model(c.scenes, 9);
  optim::AdamW opt(model.parameters(), {});
  auto grads = [&] {
    std::vector<std::vector<float>> g;
    for (const Tensor& p : model.parameters()) g.push_back(p.grad().contiguous().to_vector<float>());
    return g;
  };
  // the first step whose two halves hold captions of other lengths (where the mean of the two
  // slices' means would not be the global mean)
  int64_t step = 0;
  while (step < 50 && train_batch(d, c, 8, step, 0, 2).batch.words == train_batch(d, c, 8, step, 1, 2).batch.words)
    ++step;
  REQUIRE(step < 50);
  const TrainBatch all = train_batch(d, c, 8, step);  // the step's 8 scenes: one process
  CHECK(all.scenes == 8);
  CHECK(all.loss_tokens == double(all.batch.words));
  const double loss = forward_backward(model, opt, all, 0.0);
  {
    NoGradGuard no_grad;  // the mean over the caption tokens, as caption_loss computes it alone
    CHECK(loss == doctest::Approx(caption_loss(model, all.batch).item<double>()).epsilon(1e-6));
  }
  const auto g1 = grads();
  // fp16's loss scale: backward from 4 x the loss, the loss itself returned; x4 is exact in floating
  // point, so every gradient is 4 x the unscaled one bit for bit (and zeroed first: not 5 x)
  CHECK(forward_backward(model, opt, all, 0.0, 4.0) == loss);
  const auto g4 = grads();
  for (size_t i = 0; i < g1.size(); ++i)
    for (size_t j = 0; j < g1[i].size(); ++j) REQUIRE(g4[i][j] == 4 * g1[i][j]);
  // two ranks, 4 scenes each, captions of other lengths: each divides its summed loss by half the
  // global batch's tokens, so the mean of the two gradients is the global batch's
  const TrainBatch r0 = train_batch(d, c, 8, step, 0, 2), r1 = train_batch(d, c, 8, step, 1, 2);
  CHECK(r0.batch.words + r1.batch.words == all.batch.words);
  CHECK(r0.loss_tokens == all.batch.words / 2.0);
  CHECK(r1.loss_tokens == all.batch.words / 2.0);
  forward_backward(model, opt, r0, 0.0);
  const auto a = grads();
  forward_backward(model, opt, r1, 0.0);
  const auto b = grads();
  for (size_t i = 0; i < g1.size(); ++i) {
    std::vector<double> mean(g1[i].size()), whole(g1[i].begin(), g1[i].end());
    for (size_t j = 0; j < mean.size(); ++j) mean[j] = (double(a[i][j]) + double(b[i][j])) / 2;
    check_close(mean, whole, 1e-6, 1e-4);  // f32 sums over the scenes, in other orders
  }
}

TEST_CASE("imagetext: the retrieval scores are each pair's summed log-likelihood") {
  std::vector<int64_t> labels;
  for (int i = 0; i < 20; ++i) labels.push_back((i * 3) % 10);
  const data::ImageDataset src = items(8, labels);
  const SceneConfig sc = tiny_scenes();
  const std::vector<Scene> scenes = compose_scenes(src, sc, 2, SceneSplit::test, 0, 4);
  const SceneBatch b = make_scene_batch(src, sc, scenes, {{0.3}, {0.4}});
  ImageText model = tiny_model(sc, 4);
  std::vector<std::vector<int64_t>> captions;
  for (const Scene& s : scenes) captions.push_back(caption_tokens(s));
  captions.push_back({kBos, kEos});  // an empty caption: only the <eos> term
  const std::vector<double> S = caption_scores(model, b.images, captions);
  REQUIRE(S.size() == 4 * 5);
  NoGradGuard ng;
  model.eval();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      // the oracle: one forward of image i with caption j alone, log-softmax, the tokens' terms summed
      const auto& c = captions[size_t(j)];
      const int64_t n = int64_t(c.size()) - 1;
      const Tensor idx = from_vector<int64_t>(std::vector<int64_t>(c.begin(), c.end() - 1), {1, n});
      const std::vector<double> lp =
          log_softmax(model.forward(b.images.narrow(0, i, 1), idx).to(DType::f64), 2).to_vector<double>();
      const int64_t V = caption_vocab_size();
      double want = 0;
      for (int64_t t = 0; t < n; ++t) want += lp[size_t(t * V + c[size_t(t + 1)])];
      CHECK(S[size_t(i * 5 + j)] == doctest::Approx(want).epsilon(1e-5));
    }
}

TEST_CASE("imagetext: recall at 1 and 5 on hand-made score matrices") {
  // 6 queries, distinct captions; image i scores caption j as -(distance); row 0: its own caption
  // ranks 3rd (two wrong ones above), the other rows rank their own first.
  std::vector<std::vector<int64_t>> caps;
  for (int64_t i = 0; i < 6; ++i) caps.push_back({kBos, kFirstWord + i, kEos});
  std::vector<double> S(36);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 6; ++j) S[size_t(i * 6 + j)] = i == j ? 0.0 : -1.0 - double(std::abs(i - j));
  S[0 * 6 + 4] = 0.5, S[0 * 6 + 5] = 0.25;  // image 0: two wrong captions above its own
  RetrievalResult r = recall_at(S, 6, caps);
  CHECK(r.i2t_r1 == doctest::Approx(5.0 / 6));
  CHECK(r.i2t_r5 == doctest::Approx(1.0));
  // columns: caption 4 is ranked by the images; image 0 scores it 0.5 > image 4's own 0: a miss at @1;
  // caption 5 likewise (0.25 > 0)
  CHECK(r.t2i_r1 == doctest::Approx(4.0 / 6));
  CHECK(r.t2i_r5 == doctest::Approx(1.0));
  // a tie goes to the match
  S[0 * 6 + 4] = 0.0, S[0 * 6 + 5] = 0.0;
  r = recall_at(S, 6, caps);
  CHECK(r.i2t_r1 == doctest::Approx(1.0));
  CHECK(r.t2i_r1 == doctest::Approx(1.0));
  // a duplicate caption: scenes 0 and 1 show the same items, so caption 1 is a match for image 0
  caps[1] = caps[0];
  S[0 * 6 + 4] = 0.5, S[0 * 6 + 5] = 0.25, S[0 * 6 + 1] = 0.75;
  r = recall_at(S, 6, caps);
  CHECK(r.i2t_r1 == doctest::Approx(1.0));  // image 0's best match (0.75) beats every wrong caption
  AG_CHECK_ERROR(recall_at(S, 5, caps), "recall_at", "5 x 5");
}

TEST_CASE("imagetext: the word-to-item share on hand-made attention weights") {
  // row layout, 8x8 items, 3 slots, patch 4: 12 patches (slots 0 0 1 1 2 2 / 0 0 1 1 2 2), Tk = 13
  const SceneConfig sc = tiny_scenes();
  const std::vector<int64_t> slot = patch_slots(sc, 4);
  Scene s;
  s.images = {0, 1}, s.labels = {4, 5};  // 2 items: slots 0 and 1; slot 2 blank
  // one block, 2 heads, T = 4 positions. Query 0 (word 1): head 0 all on patch 0 (slot 0), head 1
  // 0.5 on the class token, 0.5 on patch 2 (slot 1): slot masses 0.5 vs 0.25: a hit.
  // Query 1 (word 2): both heads 0.6 on the blank slot's patch 4, 0.4 on patch 1 (slot 0): slot 1 got
  // nothing, slot 0 got 0.4 -> a miss (the blank slot is no candidate).
  std::vector<double> w(size_t(1 * 2 * 4 * 13), 0.0);
  auto at = [&](int64_t h, int64_t q, int64_t key) -> double& { return w[size_t((h * 4 + q) * 13 + key)]; };
  at(0, 0, 1) = 1.0;
  at(1, 0, 0) = 0.5, at(1, 0, 3) = 0.5;
  for (int64_t h = 0; h < 2; ++h) at(h, 1, 5) = 0.6, at(h, 1, 2) = 0.4;
  const Tensor t = from_vector<double>(w, {1, 2, 4, 13});
  WordItemShare r = word_item_share_of({t}, slot, std::span<const Scene>(&s, 1));
  CHECK(r.words == 2);
  CHECK(r.share == doctest::Approx(0.5));
  CHECK(r.per_block == std::vector<double>{0.5});
  CHECK(r.chance == doctest::Approx(0.5));
  CHECK(r.cls_mass == doctest::Approx((0.25 + 0.0) / 2));  // mean over the words of the head-averaged class mass
  // a second block that gets word 2 right: the per-block shares differ; the mean of the masses decides
  std::vector<double> w2(w.size(), 0.0);
  for (int64_t h = 0; h < 2; ++h) w2[size_t((h * 4 + 0) * 13 + 1)] = 1.0, w2[size_t((h * 4 + 1) * 13 + 3)] = 1.0;
  r = word_item_share_of({t, from_vector<double>(w2, {1, 2, 4, 13})}, slot, std::span<const Scene>(&s, 1));
  CHECK(r.per_block == std::vector<double>{0.5, 1.0});
  // word 2, mean over blocks: slot 0 (0.4 + 0) / 2 = 0.2, slot 1 (0 + 1) / 2 = 0.5: a hit
  CHECK(r.share == doctest::Approx(1.0));
}

TEST_CASE("imagetext: cross-attention rows are distributions over the image tokens, and causal") {
  std::vector<int64_t> labels;
  for (int i = 0; i < 10; ++i) labels.push_back(i);
  const data::ImageDataset src = items(8, labels);
  const SceneConfig sc = tiny_scenes();
  const std::vector<Scene> scenes = compose_scenes(src, sc, 4, SceneSplit::val, 0, 3);
  const SceneBatch b = make_scene_batch(src, sc, scenes, {{0.3}, {0.4}});
  ImageText model = tiny_model(sc, 9);
  const std::vector<Tensor> w = cross_attention(model, b.images, b.input);
  REQUIRE(w.size() == 2);  // one per decoder block
  for (const Tensor& t : w) {
    CHECK(t.shape() == Shape{3, 2, 4, 13});
    const std::vector<double> rows = sum(t.to(DType::f64), {3}).to_vector<double>();
    for (double r : rows) CHECK(r == doctest::Approx(1.0).epsilon(1e-5));
  }
  // changing the last token leaves the rows before it as they were (causal self-attention below)
  std::vector<int64_t> in = b.input.to_vector<int64_t>();
  for (size_t k = 0; k < 3; ++k) in[k * 4 + 3] = kFirstWord + 5;
  const std::vector<Tensor> w2 = cross_attention(model, b.images, from_vector<int64_t>(in, {3, 4}));
  check_close(w2[1].narrow(2, 0, 3), w[1].narrow(2, 0, 3), 1e-7, 1e-6);
  CHECK(max(abs(w2[1].narrow(2, 3, 1) - w[1].narrow(2, 3, 1))).item<double>() > 1e-6);
  // and the SVG: per scene, per generated word, the mean panel and one per head
  const std::string svg = attention_svg(model, src, sc, scenes, {{0.3}, {0.4}});
  size_t expected = 0, drawn = 0;
  for (const Scene& s : scenes) {  // the scene (8 x 24 pixels) once per generated word, at least once
    const SceneBatch one = make_scene_batch(src, sc, std::span<const Scene>(&s, 1), {{0.3}, {0.4}});
    expected += 8 * 24 * std::max<size_t>(caption_words_of(greedy_captions(model, one.images)[0]).size(), 1);
  }
  for (size_t at = svg.find("class=\"pixel\""); at != std::string::npos; at = svg.find("class=\"pixel\"", at + 1))
    ++drawn;
  CHECK(drawn == expected);
  CHECK(svg.find("mean of 2 heads x 2 blocks") != std::string::npos);
  CHECK(svg.find("block 1 head 1") != std::string::npos);
  CHECK(svg.rfind("</svg>") != std::string::npos);
}

TEST_CASE("imagetext: a tiny run learns, writes its files, resumes bit for bit and evaluates its checkpoint") {
  Apps apps("imagetext_run");
  const std::string out = apps.tmp.file("stdout.txt"), err = apps.tmp.file("stderr.txt");
  REQUIRE(run_command(tiny_command(apps, "a", 160), out, err) == 0);
  INFO("stderr: " << read_bytes(err));
  const nlohmann::json report = nlohmann::json::parse(read_bytes(apps.tmp.file("a/report.json")));
  INFO("report: " << report.dump());
  // items differ by brightness: the captions are learned far above chance (guessing an exact
  // caption: 1/2 for the count of items, times 1/4 for each word: at most 1/8)
  const auto& x = report;  // the app's figures sit beside the standard fields
  CHECK(x.at("test_exact_match").get<double>() > 0.6);
  CHECK(x.at("image_to_text_r1").get<double>() > 0.5);
  CHECK(x.contains("word_item_share"));
  // chance: over the words, 1 for a 1-item scene's word, 1/2 for each of a 2-item scene's two: about 2/3
  CHECK(x.at("word_item_share_chance").get<double>() == doctest::Approx(2.0 / 3).epsilon(0.15));
  for (const char* f : {"checkpoint.safetensors", "best.safetensors", "metrics.jsonl", "curves.svg", "attention.svg"})
    CHECK_MESSAGE(std::filesystem::exists(apps.tmp.file(std::string("a/") + f)), f);
  const std::vector<nlohmann::json> evals = read_metrics(apps.tmp.file("a/metrics.jsonl"), "eval");
  REQUIRE(evals.size() == 4);
  CHECK(evals.back().contains("val_exact_match"));
  CHECK(evals.back().at("val_loss").get<double>() < evals.front().at("val_loss").get<double>());

  // stopped at 80 and resumed: the same checkpoint as the straight run, bit for bit
  REQUIRE(run_command(tiny_command(apps, "b", 160, {"--stop-at", "80"}), out, err) == 0);
  REQUIRE(run_command(tiny_command(apps, "b", 160, {"--resume"}), out, err) == 0);
  check_checkpoints(apps.checkpoint("a"), apps.checkpoint("b"));

  // --eval-only on the checkpoint prints the test figures
  REQUIRE(run_command(tiny_command(apps, "a", 160, {"--eval-only"}), out, err) == 0);
  const std::string text = read_bytes(out);
  INFO("stdout: " << text);
  CHECK(text.find("exact caption match") != std::string::npos);
  CHECK(text.find("image->text R@1") != std::string::npos);
  // ... and refuses a model option that differs from the checkpoint's, which it would ignore
  REQUIRE(run_command(with_option(tiny_command(apps, "a", 160, {"--eval-only"}), "--dec-layers", "2"), out, err) ==
          ag::apps::kExitUsage);
  CHECK(read_bytes(err) == fmt::format("imagetext: --dec-layers 2: --eval-only evaluates the model as '{}' saved it, "
                                       "with --dec-layers 1; drop the option, or train a model with it (imagetext "
                                       "--help lists every option)\n",
                                       apps.checkpoint("a")));
}

TEST_CASE("imagetext: the binary exits 2 with one line for a bad option, before any work") {
  TempDir dir("imagetext_cli");
  const std::string out = dir.file("run"), err = dir.file("stderr.txt");
  const std::string app = std::string(ATTOGRAD_APP_DIR) + "/imagetext";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--heads", "3"}, "imagetext: --heads 3 does not divide --d-model 64 (each head gets d-model/heads) (imagetext "
                         "--help lists every option)\n"},
      {{"--layout", "grid", "--max-items", "6"},
       "imagetext: --max-items 6: layout grid has room for at most 4 items (imagetext --help lists every option)\n"},
      {{"--retrieval-candidates", "50", "--test-scenes", "20"},
       "imagetext: --retrieval-candidates 50 is more than the --test-scenes 20 (imagetext --help lists every "
       "option)\n"}};
  for (const auto& [args, want] : cases) {
    std::vector<std::string> a = {app, "--out", out, "--data-dir", dir.file("no-data")};
    a.insert(a.end(), args.begin(), args.end());
    CHECK(run_command(a, dir.file("stdout.txt"), err) == kExitUsage);
    CHECK(read_bytes(err) == want);
    CHECK_FALSE(std::filesystem::exists(out));  // nothing started
  }
  // missing data: exit 2, the message names the package
  CHECK(run_command({app, "--out", out, "--data-dir", dir.file("no-data")}, dir.file("stdout.txt"), err) == kExitNoData);
  CHECK(read_bytes(err).find("dataset-fashion-mnist") != std::string::npos);
}

TEST_CASE("imagetext: a checkpoint longseq wrote is refused by --eval-only and --resume, naming longseq") {
  Apps apps("imagetext_foreign");
  const std::string out = apps.tmp.file("stdout.txt"), err = apps.tmp.file("stderr.txt");
  REQUIRE(run_command({std::string(ATTOGRAD_APP_DIR) + "/longseq", "--task", "pixels", "--data-dir",
                       apps.tmp.file("fashion"), "--val-size", "40", "--steps", "2", "--batch", "8", "--d-model", "16",
                       "--heads", "2", "--layers", "1", "--mlp", "32", "--threads", "1", "--quiet", "--out",
                       apps.tmp.file("theirs")},
                      out, err) == 0);
  const std::string theirs = apps.checkpoint("theirs"), before = read_bytes(theirs);
  const std::string refused = fmt::format("imagetext: '{}' is a checkpoint of longseq, not of imagetext: give a "
                                          "checkpoint that imagetext wrote (imagetext --help lists every option)\n",
                                          theirs);
  CHECK(run_command(tiny_command(apps, "mine", 4, {"--eval-only", "--checkpoint", theirs}), out, err) == kExitUsage);
  CHECK(read_bytes(err) == refused);
  CHECK(run_command(tiny_command(apps, "theirs", 4, {"--resume"}), out, err) == kExitUsage);
  CHECK(read_bytes(err).ends_with("\n" + refused));  // after the run's header lines
  CHECK(read_bytes(theirs) == before);
}
