// safetensors reading and writing (the format is described in core/serialize.h).
//
// Saving: build the JSON header (offsets are running sums of the tensors' byte sizes), pad it with
// spaces to a multiple of 8 bytes as the reference implementation does, then write
// length + header + data to a temporary file that is renamed over the target only once it is
// complete and on disk.
//
// Loading: the header is parsed and every entry checked (dtype, shape, offsets, byte size, and that
// the tensors tile the data part exactly) before a single data byte is read; each tensor is then
// read straight into its own storage. No offset from the file is used before it is bounds-checked.
#include "core/serialize.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/allocator.h"

namespace ag {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; attograd writes and reads its memory as is");

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The reference implementation refuses headers above 100 MB; so do we, before allocating one.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i64: return "I64";
    case DType::b8: return "BOOL";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  fail("internal: unknown dtype {}", int(t));
}

bool parse_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::f32, DType::f64, DType::i64, DType::b8, DType::bf16, DType::f16})
    if (s == safetensors_dtype(t)) {
      *out = t;
      return true;
    }
  return false;
}

// ---- saving ---------------------------------------------------------------------------------

template <class... Args>
[[noreturn]] void save_error(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format("save_safetensors: '{}': {}", path, fmt::format(f, std::forward<Args>(args)...)));
}

// The temporary file of one save: removed on every path that does not end in the rename.
struct TempFile {
  std::string path;
  int fd = -1;
  bool renamed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!renamed) ::unlink(path.c_str());
  }
};

// write(2) until all n bytes are out (it may write less, or be interrupted by a signal).
bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= size_t(w);
  }
  return true;
}

// `t`'s values, row-major on the host, without history. A non-contiguous device tensor comes over
// as its whole storage (one plain copy) and is then laid out row-major on the host, so saving
// needs no device kernel besides the copy.
Tensor host_row_major(const Tensor& t) {
  const Tensor d = t.detach();
  if (d.device().is_cpu() || d.is_contiguous()) return host_contiguous(d);
  const Storage& s = *d.impl().storage;
  Tensor whole = empty({int64_t(s.bytes / itemsize(d.dtype()))}, d.dtype());
  device_copy(whole.raw_data(), Device::cpu(), s.ptr, s.device, whole.nbytes());
  return host_contiguous(as_strided(whole, d.shape(), d.strides(), d.offset()));
}

std::string folder_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Removes the temporary files that earlier saves of `path` left when their process was killed
// mid-write (SIGKILL, the OOM killer, a power cut): "<name>.tmp.<pid>" whose process no longer
// exists. A live process's file (a concurrent save) is left alone. Best effort: a failure to list
// or remove is not an error of this save.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string prefix = fs::path(path).filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(folder_of(path), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const pid_t pid = pid_t(std::stol(digits));
    if (pid == ::getpid() || pid <= 0) continue;
    if (::kill(pid, 0) == -1 && errno == ESRCH) ::unlink(it->path().c_str());
  }
}

// ---- loading --------------------------------------------------------------------------------

template <class... Args>
[[noreturn]] void load_error(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format("load_safetensors: '{}': {}", path, fmt::format(f, std::forward<Args>(args)...)));
}

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // [begin, end) in bytes from the start of the data part
};

// Checks one tensor entry of the header against the spec and the size of the data part.
Entry parse_entry(const std::string& path, const std::string& name, const ordered_json& v, uint64_t data_bytes) {
  Entry e;
  e.name = name;
  if (name.empty()) load_error(path, "a tensor has an empty name");
  if (!v.is_object()) load_error(path, "tensor '{}': expected a JSON object, got {}", name, v.type_name());
  for (const auto& [key, unused] : v.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      load_error(path, "tensor '{}': unexpected key '{}' (expected dtype, shape, data_offsets)", name, key);

  // dtype
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) load_error(path, "tensor '{}': missing or non-string \"dtype\"", name);
  const std::string dts = dt->get<std::string>();
  if (!parse_dtype(dts, &e.dtype))
    load_error(path, "tensor '{}': unknown dtype '{}' (attograd reads F32, F64, I64, BOOL, BF16 and F16)", name,
               dts);

  // shape: a list of at most kMaxDims non-negative integers whose byte size fits in a uint64
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) load_error(path, "tensor '{}': missing or non-list \"shape\"", name);
  if (sh->size() > size_t(kMaxDims))
    load_error(path, "tensor '{}': shape has {} dims, attograd supports at most {}", name, sh->size(), kMaxDims);
  uint64_t nbytes = itemsize(e.dtype);
  bool overflow = false, has_zero = false;
  for (const ordered_json& d : *sh) {
    // nlohmann stores a non-negative integer literal as unsigned; -1 is signed, 2.0 is a float
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
      load_error(path, "tensor '{}': shape {} is not a list of non-negative integers", name, sh->dump());
    uint64_t dim = d.get<uint64_t>();
    // the product of the non-zero dims must stay small too: strides are computed from it
    if (dim > 0) overflow = overflow || __builtin_mul_overflow(nbytes, dim, &nbytes);
    has_zero = has_zero || dim == 0;
    e.shape.push_back(int64_t(dim));
  }
  if (overflow || nbytes > uint64_t(INT64_MAX))
    load_error(path, "tensor '{}': shape {} is too large", name, sh->dump());
  if (has_zero) nbytes = 0;

  // data_offsets: [begin, end] within the data part, end - begin == numel * itemsize
  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    load_error(path, "tensor '{}': \"data_offsets\" must be a list of two non-negative integers, got {}", name,
               off == v.end() ? std::string("nothing") : off->dump());
  e.begin = (*off)[0].get<uint64_t>();
  e.end = (*off)[1].get<uint64_t>();
  if (e.begin > e.end)
    load_error(path, "tensor '{}': data_offsets [{}, {}] end before they begin", name, e.begin, e.end);
  if (e.end > data_bytes)
    load_error(path, "tensor '{}': data_offsets [{}, {}] are out of range: the data part has {} bytes", name,
               e.begin, e.end, data_bytes);
  if (e.end - e.begin != nbytes)
    load_error(path, "tensor '{}': data_offsets [{}, {}] span {} bytes, but {} {} needs {}", name, e.begin, e.end,
               e.end - e.begin, safetensors_dtype(e.dtype), e.shape, nbytes);
  return e;
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, FloatStorage f32_as) {
  // 1. The header (keys in file order, "__metadata__" first as the reference writes it) and the
  //    row-major host copies whose bytes follow it.
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json& m = header["__metadata__"] = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
  }
  std::set<std::string> seen;
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (name.empty()) save_error(path, "tensor {} has an empty name", i);
    if (name == "__metadata__") save_error(path, "'__metadata__' is reserved and cannot name a tensor");
    if (!seen.insert(name).second) save_error(path, "duplicate tensor name '{}'", name);
    if (!t.defined()) save_error(path, "tensor '{}' is undefined", name);
    Tensor h = host_row_major(t);
    if (f32_as != FloatStorage::f32 && h.dtype() == DType::f32) {
      const Tensor x = h;
      h = cast(x, f32_as == FloatStorage::bf16 ? DType::bf16 : DType::f16);
      if (f32_as == FloatStorage::f16) {  // the first finite value that rounded to inf, named
        const float* xv = x.data<float>();
        const f16* hv = h.data<f16>();
        for (int64_t k = 0; k < h.numel(); ++k)
          if (std::isinf(float(hv[k])) && std::isfinite(xv[k]))
            save_error(path,
                       "tensor '{}': element {} = {} is beyond F16's range (largest 65504); save it as BF16 or F32",
                       name, k, xv[k]);
      }
    }
    const uint64_t nbytes = h.nbytes();
    ordered_json entry = ordered_json::object();
    entry["dtype"] = safetensors_dtype(h.dtype());
    entry["shape"] = ordered_json::array();
    for (int64_t d : h.shape()) entry["shape"].push_back(d);
    entry["data_offsets"] = ordered_json::array({offset, offset + nbytes});
    header[name] = std::move(entry);
    offset += nbytes;
    host.push_back(h);
  }
  std::string text;
  try {
    text = header.dump();  // compact, as the reference writes it
  } catch (const json::exception& e) {
    save_error(path, "a tensor name or metadata string is not valid UTF-8 ({})", e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();  // memory order is little-endian (static_assert above)

  // 2. The bytes go to a temporary file next to the target, on disk before the rename.
  remove_stale_temporaries(path);
  TempFile tmp{path + ".tmp." + std::to_string(::getpid())};
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0) save_error(path, "cannot create temporary file '{}': {}", tmp.path, std::strerror(errno));
  bool ok = write_all(tmp.fd, &header_len, 8) && write_all(tmp.fd, text.data(), text.size());
  for (size_t i = 0; ok && i < host.size(); ++i)
    if (host[i].nbytes() > 0) ok = write_all(tmp.fd, host[i].raw_data(), host[i].nbytes());
  if (!ok) save_error(path, "cannot write temporary file '{}': {}", tmp.path, std::strerror(errno));
  if (::fsync(tmp.fd) != 0) save_error(path, "cannot fsync temporary file '{}': {}", tmp.path, std::strerror(errno));
  int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) save_error(path, "cannot close temporary file '{}': {}", tmp.path, std::strerror(errno));

  // 3. The rename replaces the old file in one step; the directory's fsync makes it durable.
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    save_error(path, "cannot rename '{}' over it: {}", tmp.path, std::strerror(errno));
  tmp.renamed = true;
  const std::string dir = folder_of(path);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) save_error(path, "saved, but cannot open folder '{}' to fsync it: {}", dir, std::strerror(errno));
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  // EINVAL: the filesystem does not support fsync on a folder; the rename is all it offers
  if (rc != 0 && err != EINVAL)
    save_error(path, "saved, but cannot fsync folder '{}': {}", dir, std::strerror(err));
}

std::vector<std::pair<std::string, Tensor>> load_safetensors(const std::string& path,
                                                             std::map<std::string, std::string>* metadata) {
  // 1. Length prefix and header, both checked against the file's size before they are read.
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) load_error(path, "is a directory");
  std::ifstream f(path, std::ios::binary);
  if (!f) load_error(path, "cannot open: {}", std::strerror(errno));
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) load_error(path, "cannot get the file size: {}", ec.message());
  if (file_bytes < 8) load_error(path, "the file has {} bytes, too few for the 8-byte header length", file_bytes);
  uint64_t header_len = 0;
  if (!f.read(reinterpret_cast<char*>(&header_len), 8)) load_error(path, "cannot read the header length");
  if (header_len > kMaxHeaderBytes)
    load_error(path, "header length {} is larger than the {}-byte limit (corrupt file?)", header_len,
               kMaxHeaderBytes);
  if (header_len > file_bytes - 8)
    load_error(path, "header length {} exceeds the {} bytes that follow it (truncated file?)", header_len,
               file_bytes - 8);
  std::string text(header_len, '\0');
  if (!f.read(text.data(), std::streamsize(header_len))) load_error(path, "cannot read the {}-byte header", header_len);
  if (text.empty() || text[0] != '{') load_error(path, "the header does not start with a JSON object '{{'");
  const uint64_t data_bytes = file_bytes - 8 - header_len;

  // 2. The JSON, its keys kept in file order (ordered_json), so that tensors of equal offsets (all
  //    the empty ones sit at one offset) come back in the order they were saved in. The callback
  //    refuses nesting beyond what the format uses (object > entry > shape list), so a hostile
  //    header cannot build a deep tree, and catches duplicate keys: tensor names, and the keys of
  //    one entry or of "__metadata__" (which value would count is not defined).
  std::set<std::string> names, inner;  // keys of the header object; of the object at depth 1
  std::string current;                 // the last key of the header object
  auto callback = [&](int depth, json::parse_event_t event, ordered_json& parsed) {
    if (depth > 3) load_error(path, "malformed header: JSON nested deeper than the format allows");
    if (event == json::parse_event_t::object_start && depth == 1) inner.clear();
    if (event == json::parse_event_t::key && depth == 1) {
      current = parsed.get<std::string>();
      if (!names.insert(current).second) load_error(path, "malformed header: duplicate key '{}'", current);
    }
    if (event == json::parse_event_t::key && depth == 2 && !inner.insert(parsed.get<std::string>()).second)
      load_error(path, "malformed header: duplicate key '{}' in '{}'", parsed.get<std::string>(), current);
    return true;
  };
  ordered_json j;
  try {
    j = ordered_json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    load_error(path, "malformed JSON header: {}", e.what());
  }
  if (!j.is_object()) load_error(path, "the header is a JSON {}, not an object", j.type_name());

  // 3. Every entry, then the layout: sorted by offset, the tensors must tile [0, data_bytes).
  std::map<std::string, std::string> meta;
  std::vector<Entry> entries;
  for (const auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) load_error(path, "\"__metadata__\" must be an object of strings, got {}", v.type_name());
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string())
          load_error(path, "\"__metadata__\" entry '{}' must be a string, got {}", mk, mv.type_name());
        meta[mk] = mv.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, key, v, data_bytes));
  }
  // stable: tensors with the same offsets (empty ones) keep their order in the header
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;  // bytes [0, covered) belong to the tensors seen so far
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      load_error(path, "tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", e.name, e.begin, e.end,
                 prev->name, prev->begin, prev->end);
    if (e.begin > covered)
      load_error(path, "tensor '{}': data_offsets [{}, {}] leave a gap: bytes [{}, {}) belong to no tensor", e.name,
                 e.begin, e.end, covered, e.begin);
    covered = e.end;
    prev = &e;
  }
  if (covered != data_bytes)
    load_error(path, "trailing data: the tensors end at byte {} of the data part, but it has {} bytes", covered,
               data_bytes);

  // 4. The data, read in file order straight into each tensor's storage.
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype);
    const uint64_t n = e.end - e.begin;
    if (n > 0) {
      f.seekg(std::streamoff(8 + header_len + e.begin));
      if (!f.read(static_cast<char*>(t.raw_data()), std::streamsize(n)))
        load_error(path, "tensor '{}': cannot read its {} bytes (file changed while reading?)", e.name, n);
    }
    if (e.dtype == DType::b8) {  // a C++ bool must hold 0 or 1: check the bytes before they are used
      const unsigned char* b = static_cast<const unsigned char*>(t.raw_data());
      for (uint64_t i = 0; i < n; ++i)
        if (b[i] > 1) load_error(path, "tensor '{}': BOOL element {} has byte value {}, not 0 or 1", e.name, i, b[i]);
    }
    out.emplace_back(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

std::map<std::string, Tensor> load_safetensors_map(const std::string& path,
                                                   std::map<std::string, std::string>* metadata) {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : load_safetensors(path, metadata)) out.emplace(name, std::move(t));
  return out;
}

}  // namespace ag
