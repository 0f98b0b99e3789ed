#include "apps/imagetext/scene.h"

#include <algorithm>
#include <sstream>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "data/text.h"

namespace ag::apps {

// ---- captions ----------------------------------------------------------------------------------

const std::vector<std::string>& caption_words() {
  static const std::vector<std::string> words = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                                 "sandal",  "shirt",   "sneaker",  "bag",   "boot"};
  return words;
}

int64_t caption_vocab_size() { return kFirstWord + int64_t(caption_words().size()); }

std::string caption_text(std::span<const int64_t> labels) {
  std::string s;
  for (size_t k = 0; k < labels.size(); ++k) {
    check(labels[k] >= 0 && labels[k] < int64_t(caption_words().size()), "imagetext: class {} has no caption word",
          labels[k]);
    s += (k ? ", " : "") + caption_words()[size_t(labels[k])];
  }
  return s;
}

std::vector<int64_t> encode_caption(const std::string& text) {
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::istringstream in(spaced);
  std::vector<int64_t> ids;
  for (std::string w; in >> w;) {
    const auto& words = caption_words();
    const auto it = std::find(words.begin(), words.end(), w);
    check(it != words.end(), "imagetext: '{}' in the caption '{}' is not a word of the vocabulary ({})", w, text,
          fmt::join(words, ", "));
    ids.push_back(kFirstWord + (it - words.begin()));
  }
  return ids;
}

std::vector<int64_t> caption_words_of(std::span<const int64_t> ids) {
  std::vector<int64_t> words;
  for (int64_t id : ids) {
    if (id == kEos) break;
    if (id >= kFirstWord && id < caption_vocab_size()) words.push_back(id);
  }
  return words;
}

std::string decode_caption(std::span<const int64_t> ids) {
  std::vector<int64_t> labels;
  for (int64_t id : caption_words_of(ids)) labels.push_back(id - kFirstWord);
  return caption_text(labels);
}

// ---- scenes ------------------------------------------------------------------------------------

const std::vector<std::string>& scene_layouts() {
  static const std::vector<std::string> layouts = {"row", "grid"};
  return layouts;
}

std::pair<int64_t, int64_t> SceneConfig::slot_origin(int64_t k) const {
  if (layout == "grid") return {item_size * (k / 2), item_size * (k % 2)};
  return {0, item_size * k};
}

void check_scene_config(const SceneConfig& c) {
  check(c.layout == "row" || c.layout == "grid", "imagetext: --layout '{}': expected row or grid", c.layout);
  check(c.min_items >= 1 && c.max_items >= c.min_items,
        "imagetext: --min-items {} and --max-items {}: expected 1 <= min-items <= max-items", c.min_items,
        c.max_items);
  const int64_t cap = c.layout == "grid" ? 4 : 8;
  check(c.max_items <= cap, "imagetext: --max-items {}: layout {} has room for at most {} items", c.max_items,
        c.layout, cap);
  check(c.item_size >= 1, "imagetext: item size {} must be positive", c.item_size);
}

namespace {

// The draw of scene `index` (see scene.h): a uniform integer in [0, n) from Philox4x32-10 at stream
// 16 split + j (j <= 8 < 16, so every (split, j) has its own stream) and counter `index`.
uint64_t scene_draw(uint64_t seed, SceneSplit split, uint64_t index, uint64_t j, uint64_t n) {
  return data::philox_below(seed, 16 * uint64_t(split) + j, index, n);
}

}  // namespace

Scene compose_scene(const data::ImageDataset& source, const SceneConfig& c, uint64_t seed, SceneSplit split,
                    uint64_t index) {
  check(source.size() > 0, "imagetext: no source images to compose a scene from");
  check(source.height == c.item_size && source.width == c.item_size && source.channels == 1,
        "imagetext: expected {}x{} grey item images, got {}x{}x{}", c.item_size, c.item_size, source.channels,
        source.height, source.width);
  const uint64_t span = uint64_t(c.max_items - c.min_items + 1);
  const int64_t n = c.min_items + int64_t(scene_draw(seed, split, index, 0, span));
  Scene s;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t i = int64_t(scene_draw(seed, split, index, uint64_t(k) + 1, uint64_t(source.size())));
    s.images.push_back(i);
    s.labels.push_back(source.labels[size_t(i)]);
  }
  return s;
}

std::vector<Scene> compose_scenes(const data::ImageDataset& source, const SceneConfig& c, uint64_t seed,
                                  SceneSplit split, uint64_t first, int64_t count) {
  std::vector<Scene> out;
  out.reserve(size_t(std::max<int64_t>(count, 0)));
  for (int64_t i = 0; i < count; ++i) out.push_back(compose_scene(source, c, seed, split, first + uint64_t(i)));
  return out;
}

std::vector<uint8_t> scene_pixels(const data::ImageDataset& source, const SceneConfig& c, const Scene& s) {
  const int64_t H = c.height(), W = c.width(), S = c.item_size;
  check(int64_t(s.images.size()) <= c.slots(), "imagetext: a scene of {} items in {} slots", s.images.size(),
        c.slots());
  std::vector<uint8_t> px(size_t(H * W), 0);
  for (size_t k = 0; k < s.images.size(); ++k) {
    check(s.images[k] >= 0 && s.images[k] < source.size(), "imagetext: item image {} outside the {} source images",
          s.images[k], source.size());
    const uint8_t* item = source.image(s.images[k]);
    const auto [r0, c0] = c.slot_origin(int64_t(k));
    for (int64_t y = 0; y < S; ++y) std::copy_n(item + y * S, S, px.begin() + (r0 + y) * W + c0);
  }
  return px;
}

std::vector<int64_t> caption_tokens(const Scene& s) {
  std::vector<int64_t> t = {kBos};
  for (int64_t c : s.labels) t.push_back(kFirstWord + c);
  t.push_back(kEos);
  return t;
}

SceneBatch make_scene_batch(const data::ImageDataset& source, const SceneConfig& c, std::span<const Scene> scenes,
                            const data::Normalization& norm) {
  check(!scenes.empty(), "imagetext: an empty batch of scenes");
  check(norm.mean.size() == 1 && norm.std.size() == 1 && norm.std[0] > 0,
        "imagetext: expected one channel's normalisation with std > 0");
  const int64_t B = int64_t(scenes.size()), H = c.height(), W = c.width(), T = c.text_len();
  std::vector<float> images(size_t(B * H * W));
  std::vector<int64_t> input(size_t(B * T), kPad), target(size_t(B * T), -100);
  const float scale = float(1.0 / (255.0 * norm.std[0])), shift = float(norm.mean[0] / norm.std[0]);
  SceneBatch out;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<uint8_t> px = scene_pixels(source, c, scenes[size_t(b)]);
    for (size_t p = 0; p < px.size(); ++p) images[size_t(b * H * W) + p] = float(px[p]) * scale - shift;  // (x/255 - m)/s
    const std::vector<int64_t> tok = caption_tokens(scenes[size_t(b)]);
    check(int64_t(tok.size()) <= T + 1, "imagetext: a caption of {} words is longer than --max-items {}",
          tok.size() - 2, c.max_items);
    for (size_t t = 0; t + 1 < tok.size(); ++t) {
      input[size_t(b * T) + t] = tok[t];
      target[size_t(b * T) + t] = tok[t + 1];
    }
    out.words += int64_t(tok.size()) - 1;
  }
  out.images = from_vector<float>(images, {B, 1, H, W});
  out.input = from_vector<int64_t>(input, {B, T});
  out.target = from_vector<int64_t>(target, {B, T});
  return out;
}

std::vector<int64_t> patch_slots(const SceneConfig& c, int64_t patch) {
  check(patch >= 1 && c.item_size % patch == 0, "imagetext: patch {} does not divide the item size {}", patch,
        c.item_size);
  const int64_t gh = c.height() / patch, gw = c.width() / patch, per = c.item_size / patch;
  std::vector<int64_t> slot(size_t(gh * gw));
  for (int64_t r = 0; r < gh; ++r)
    for (int64_t col = 0; col < gw; ++col)
      slot[size_t(r * gw + col)] = c.layout == "grid" ? (r / per) * 2 + col / per : col / per;
  return slot;
}

}  // namespace ag::apps
