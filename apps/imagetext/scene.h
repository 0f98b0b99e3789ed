#pragma once
// The data of apps/imagetext: scenes composed of Fashion-MNIST items, and their captions.
//
// A scene puts n items (min_items <= n <= max_items) of S x S pixels (S = 28) into slots of a canvas:
//   layout "row":   slots side by side, canvas S x (S max_items); slot k at column S k
//   layout "grid":  a 2 x 2 grid, canvas 2S x 2S (max_items <= 4); slot k at row S (k / 2), column S (k % 2)
// Items fill slots 0 .. n-1 in order; the other slots stay blank (pixel 0). The caption names the
// items in slot order, "sneaker, bag, dress": one word per Fashion-MNIST class (caption_words()).
//
// Reproducible from a seed: scene i of a split is a function of (seed, split, i) alone (counter-
// based draws, no state), so the training stream, a resumed run and every rank of a data-parallel
// job see the same scenes. With below_j(n) = data::philox_below(seed, 16 split + j, i, n), a
// uniform integer in [0, n) from Philox4x32-10 (the draw textclf shuffles with):
//   n = min_items + below_0(max_items - min_items + 1)
//   item k = below_{k+1}(|source images|)        (images drawn with replacement)
// The source of a split is its own image set: training scenes use the training images left after
// the validation images are held out (data::hold_out, a fixed seed), validation scenes the held-out
// images, test scenes only the test images. So no test image is ever seen in training, nor a
// validation image.
//
// Tokens (vocabulary V = 3 + 10):  0 <pad>, 1 <bos>, 2 <eos>, 3 + c the word of class c.
// A caption of n words is the sequence [<bos>, w_1 .. w_n, <eos>], padded to L = max_items + 2:
//   input  (B, L - 1) = tokens[:, :-1]    what the decoder reads (teacher forcing)
//   target (B, L - 1) = tokens[:, 1:]     what it predicts; <pad> positions -> -100 (ignored)
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/images.h"

namespace ag::apps {

// ---- captions ----------------------------------------------------------------------------------
constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kFirstWord = 3;
// The caption word of each Fashion-MNIST class 0..9: t-shirt trouser pullover dress coat sandal
// shirt sneaker bag boot.
const std::vector<std::string>& caption_words();
int64_t caption_vocab_size();  // 3 + 10

// The text of a caption given by class labels: "sneaker, bag, dress".
std::string caption_text(std::span<const int64_t> labels);
// The token ids of a caption text (words separated by ", " or spaces; case-sensitive), without
// <bos> and <eos>: "sneaker, bag" -> {10, 11}. An ag::Error names an unknown word.
std::vector<int64_t> encode_caption(const std::string& text);
// Token ids back to text: words joined by ", "; <bos> and <pad> are skipped, <eos> ends the text.
std::string decode_caption(std::span<const int64_t> ids);
// The word tokens of a token sequence up to its first <eos> (without <bos>): what decode_caption reads.
std::vector<int64_t> caption_words_of(std::span<const int64_t> ids);

// ---- scenes ------------------------------------------------------------------------------------
struct SceneConfig {
  std::string layout = "row";  // row | grid
  int64_t min_items = 2, max_items = 4;
  int64_t item_size = 28;       // S: the side of one item image (Fashion-MNIST's 28)

  int64_t slots() const { return layout == "grid" ? 4 : max_items; }
  int64_t height() const { return layout == "grid" ? 2 * item_size : item_size; }
  int64_t width() const { return layout == "grid" ? 2 * item_size : item_size * max_items; }
  int64_t text_len() const { return max_items + 1; }  // L - 1: decoder positions
  // Slot k's top-left pixel (row, column).
  std::pair<int64_t, int64_t> slot_origin(int64_t k) const;
};
// The layouts --layout accepts.
const std::vector<std::string>& scene_layouts();  // {"row", "grid"}
// An ag::Error (apps turn it into a usage error) when the layout is unknown, min_items < 1,
// max_items < min_items, max_items > 4 with layout grid or > 8 with layout row.
void check_scene_config(const SceneConfig& c);

// Which split a scene stream draws from: part of the hash, so the three streams differ even for
// one seed.
enum class SceneSplit : uint64_t { train = 1, val = 2, test = 3 };

struct Scene {
  std::vector<int64_t> images;  // indices into the split's source images, slot order
  std::vector<int64_t> labels;  // their classes, slot order: the caption
};
// Scene `index` of `split` for `seed`, drawn from `source` (see the top of this file).
Scene compose_scene(const data::ImageDataset& source, const SceneConfig& c, uint64_t seed, SceneSplit split,
                    uint64_t index);
// Scenes [first, first + count) of a split.
std::vector<Scene> compose_scenes(const data::ImageDataset& source, const SceneConfig& c, uint64_t seed,
                                  SceneSplit split, uint64_t first, int64_t count);

// A batch of scenes: B canvases and their captions.
struct SceneBatch {
  Tensor images;  // f32 (B, 1, H, W), normalised with the source's statistics
  Tensor input;   // i64 (B, L - 1): <bos> w_1 .. w_n <eos> <pad>.. without the last position
  Tensor target;  // i64 (B, L - 1): w_1 .. w_n <eos> then -100 (ignored)
  int64_t words = 0;  // the target tokens that count (words and <eos>)
};
// The canvases (raw u8, (H, W) each) of scenes, and the normalised batch with their captions.
std::vector<uint8_t> scene_pixels(const data::ImageDataset& source, const SceneConfig& c, const Scene& s);
SceneBatch make_scene_batch(const data::ImageDataset& source, const SceneConfig& c, std::span<const Scene> scenes,
                            const data::Normalization& norm);
// The token sequence [<bos>, w_1 .. w_n, <eos>] of a scene (no padding).
std::vector<int64_t> caption_tokens(const Scene& s);

// Which patch of a (H / P) x (W / P) grid lies in which slot (the patch size P divides S, so each
// patch lies in exactly one slot): slot_of_patch[r * (W / P) + c].
std::vector<int64_t> patch_slots(const SceneConfig& c, int64_t patch);

}  // namespace ag::apps
