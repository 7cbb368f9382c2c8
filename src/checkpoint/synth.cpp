// Synthetic Llama-shaped checkpoint writer.
//
// Speed comes from three choices: tensor bytes come from a counter-based generator (word i of
// tensor t is a pure function of (seed, t, i)), so any block of a file can be produced
// independently; each file's data section is cut into 16 MiB blocks that a few threads fill
// and `pwrite` at their final offsets; and the file is sized up front so the filesystem can
// allocate it in large extents.
#include "weightcast/core/detail/file_open.hpp"
#include "weightcast/core/detail/unique_fd.hpp"
#include "weightcast/checkpoint/detail/index.hpp"
#include "weightcast/checkpoint/synth.hpp"

#include "weightcast/core/units.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/format/safetensors.hpp"

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unistd.h>

namespace weightcast {

static_assert(std::endian::native == std::endian::little,
              "synthetic tensor bytes are defined as little-endian 64-bit words");

namespace {

// ---- Architecture ------------------------------------------------------------------------

struct ShapeRow {
  std::uint64_t min_params;  // the row applies from this target up
  std::uint64_t vocab, hidden, intermediate, heads, kv_heads;
};

// Real Llama-family widths (config.json of each model), smallest first. The two tiny rows
// exist for fast tests; their proportions (intermediate ≈ 4 × hidden, kv_heads = heads / 2)
// follow the real ones.
constexpr std::array<ShapeRow, 8> shape_rows{{
    {0, 512, 64, 256, 4, 2},                           // tiny, for tests ("1M")
    {5'000'000, 4096, 256, 1024, 8, 4},                // small, for tests ("10M")
    {80'000'000, 49152, 576, 1536, 9, 3},              // SmolLM2-135M
    {600'000'000, 32000, 2048, 5632, 32, 4},           // TinyLlama-1.1B
    {2'500'000'000, 128256, 3072, 8192, 24, 8},        // Llama-3.2-3B
    {6'000'000'000, 128256, 4096, 14336, 32, 8},       // Llama-3-8B
    {11'000'000'000, 32000, 5120, 13824, 40, 40},      // Llama-2-13B
    {40'000'000'000, 128256, 8192, 28672, 64, 8},      // Llama-3-70B
}};

std::uint64_t params_per_layer(const LlamaShape& s) {
  std::uint64_t kv_dim = s.kv_heads * s.head_dim();
  std::uint64_t attention = 2 * s.hidden * s.hidden + 2 * s.hidden * kv_dim;
  std::uint64_t mlp = 3 * s.hidden * s.intermediate;
  return attention + mlp + 2 * s.hidden;  // + two RMSNorm weights
}

std::uint64_t params_outside_layers(const LlamaShape& s) {
  return 2 * s.vocab * s.hidden + s.hidden;  // embed_tokens, lm_head (untied), final norm
}

struct TensorSpec {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
  std::uint64_t index = 0;        // position in the checkpoint; keys the byte stream
  std::uint64_t data_offset = 0;  // within its shard's data section
  std::uint32_t shard = 0;
};

std::vector<TensorSpec> llama_tensors(const LlamaShape& s, Dtype dtype) {
  std::vector<TensorSpec> out;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
    TensorSpec t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.elements = 1;
    for (auto d : t.shape) t.elements *= d;
    std::uint64_t bits = t.elements * dtype_bits(dtype);
    if (bits % 8 != 0) {
      throw Error(Errc::usage,
                  fmt::format("synth: tensor '{}' of {} elements is not whole bytes in {}",
                              t.name, t.elements, dtype_name(dtype)));
    }
    t.bytes = bits / 8;
    t.index = out.size();
    out.push_back(std::move(t));
  };
  std::uint64_t kv_dim = s.kv_heads * s.head_dim();
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    add(p + "self_attn.q_proj.weight", {s.hidden, s.hidden});
    add(p + "self_attn.k_proj.weight", {kv_dim, s.hidden});
    add(p + "self_attn.v_proj.weight", {kv_dim, s.hidden});
    add(p + "self_attn.o_proj.weight", {s.hidden, s.hidden});
    add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden});
    add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden});
    add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate});
    add(p + "input_layernorm.weight", {s.hidden});
    add(p + "post_attention_layernorm.weight", {s.hidden});
  }
  add("model.norm.weight", {s.hidden});
  add("lm_head.weight", {s.vocab, s.hidden});
  return out;
}

// ---- Tensor bytes ------------------------------------------------------------------------

constexpr std::uint64_t golden_gamma = 0x9e3779b97f4a7c15ull;

constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Key of tensor @p index's stream: distinct tensors and seeds give unrelated streams.
constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t index) {
  return mix64(mix64(seed + golden_gamma) ^ mix64((index + 1) * golden_gamma));
}

/// Word @p i of a stream: splitmix64's output for counter i, computed directly.
inline std::uint64_t stream_word(std::uint64_t key, std::uint64_t i) {
  return mix64(key + (i + 1) * golden_gamma);
}

/// Writes bytes [begin, begin + length) of the stream @p key to @p dst.
void fill_stream(std::byte* dst, std::uint64_t key, std::uint64_t begin, std::uint64_t length) {
  // Head and tail bytes that do not fill a whole word take the word's low bytes in order.
  while (length > 0 && begin % 8 != 0) {
    std::uint64_t w = stream_word(key, begin / 8);
    *dst++ = static_cast<std::byte>(w >> (8 * (begin % 8)));
    ++begin;
    --length;
  }
  std::uint64_t first = begin / 8;
  std::uint64_t words = length / 8;
  for (std::uint64_t i = 0; i < words; ++i) {
    std::uint64_t w = stream_word(key, first + i);
    std::memcpy(dst + 8 * i, &w, 8);
  }
  dst += 8 * words;
  begin += 8 * words;
  length -= 8 * words;
  for (std::uint64_t k = 0; k < length; ++k) {
    std::uint64_t w = stream_word(key, (begin + k) / 8);
    dst[k] = static_cast<std::byte>(w >> (8 * ((begin + k) % 8)));
  }
}

// ---- Files -------------------------------------------------------------------------------

using detail::UniqueFd;

void pwrite_all(int fd, const std::byte* data, std::uint64_t length, std::uint64_t offset,
                const std::filesystem::path& path) {
  while (length > 0) {
    ssize_t n = ::pwrite(fd, data, std::min<std::uint64_t>(length, 1ull << 30),
                         static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw system_error(Errc::io, errno,
                         fmt::format("{}: write at offset {}", path.string(), offset));
    }
    if (n == 0) {
      throw Error(Errc::io, fmt::format("{}: write at offset {} wrote nothing", path.string(),
                                        offset));
    }
    data += n;
    offset += static_cast<std::uint64_t>(n);
    length -= static_cast<std::uint64_t>(n);
  }
}

/// Removes its paths when destroyed unless dismissed: no temporary file survives a failure.
class TempFiles {
 public:
  TempFiles() = default;
  TempFiles(const TempFiles&) = delete;
  TempFiles& operator=(const TempFiles&) = delete;
  ~TempFiles() {
    for (const auto& p : _paths) {
      std::error_code ec;
      std::filesystem::remove(p, ec);
    }
  }
  void add(std::filesystem::path p) { _paths.push_back(std::move(p)); }
  void dismiss() noexcept { _paths.clear(); }

 private:
  std::vector<std::filesystem::path> _paths;
};

constexpr std::uint64_t block_bytes = 16ull << 20;

/// Throws `interrupted` once @p stop is requested: checked between blocks and between files.
void throw_if_stopped(const std::stop_token& stop) {
  if (stop.stop_requested()) {
    throw Error(Errc::interrupted,
                "synth: the write was stopped (SynthOptions::stop was requested)");
  }
}

/// Writes one shard: 8-byte header length, padded JSON header, then the tensors' bytes.
/// @return the file size.
// Creates synth's temporary file @p path afresh (detail::create_fresh).
int create_temp(const std::filesystem::path& path) {
  const int fd = detail::create_fresh(path, 0644);
  if (fd < 0) throw system_error(Errc::io, errno, fmt::format("{}: create", path.string()));
  return fd;
}

std::uint64_t write_shard(const std::filesystem::path& path, const std::string& header,
                          const std::vector<const TensorSpec*>& tensors,
                          const SynthOptions& options) {
  const std::uint64_t seed = options.seed;
  std::uint64_t data_bytes = 0;
  for (const auto* t : tensors) data_bytes += t->bytes;
  std::uint64_t data_start = 8 + header.size();
  std::uint64_t file_bytes = data_start + data_bytes;

  UniqueFd fd(create_temp(path));
  // Reserve the whole file so a full disk fails here, before gigabytes are generated; where
  // the filesystem cannot preallocate, a plain size is enough.
  if (int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(file_bytes)); rc != 0) {
    if (rc != EOPNOTSUPP && rc != EINVAL) {
      throw system_error(Errc::io, rc,
                         fmt::format("{}: reserve {} bytes", path.string(), file_bytes));
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(file_bytes)) != 0) {
      throw system_error(Errc::io, errno,
                         fmt::format("{}: size to {} bytes", path.string(), file_bytes));
    }
  }

  std::vector<std::byte> head(data_start);
  std::uint64_t n = header.size();
  std::memcpy(head.data(), &n, 8);  // little-endian, asserted above
  std::memcpy(head.data() + 8, header.data(), header.size());
  pwrite_all(fd.get(), head.data(), head.size(), 0, path);

  std::uint64_t blocks = (data_bytes + block_bytes - 1) / block_bytes;
  unsigned threads = std::clamp(std::thread::hardware_concurrency(), 1u, 8u);
  threads = static_cast<unsigned>(std::min<std::uint64_t>(threads, std::max<std::uint64_t>(blocks, 1)));
  std::atomic<std::uint64_t> next_block{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  std::atomic<bool> failed{false};

  auto worker = [&] {
    try {
      std::unique_ptr<std::byte[]> buffer(new std::byte[block_bytes]);
      std::size_t first_tensor = 0;
      for (;;) {
        std::uint64_t b = next_block.fetch_add(1);
        if (b >= blocks || failed.load()) return;
        throw_if_stopped(options.stop);
        std::uint64_t begin = b * block_bytes;
        std::uint64_t end = std::min(begin + block_bytes, data_bytes);
        // Blocks are claimed in increasing order, so the first overlapping tensor only moves
        // forward; start from where this thread's previous block began.
        while (first_tensor < tensors.size() &&
               tensors[first_tensor]->data_offset + tensors[first_tensor]->bytes <= begin) {
          ++first_tensor;
        }
        for (std::size_t k = first_tensor; k < tensors.size(); ++k) {
          const TensorSpec& t = *tensors[k];
          if (t.data_offset >= end) break;
          std::uint64_t lo = std::max(begin, t.data_offset);
          std::uint64_t hi = std::min(end, t.data_offset + t.bytes);
          if (hi <= lo) continue;
          fill_stream(buffer.get() + (lo - begin), stream_key(seed, t.index), lo - t.data_offset,
                      hi - lo);
          // A BOOL element is one byte that numpy and torch read only as 0 or 1 (any other
          // byte is not a bool they can hold): keep the stream's low bit.
          if (options.dtype == Dtype::BOOL) {
            for (std::byte& b : std::span(buffer.get() + (lo - begin), hi - lo)) b &= std::byte{1};
          }
        }
        pwrite_all(fd.get(), buffer.get(), end - begin, data_start + begin, path);
        if (options.on_block) options.on_block(end - begin);
      }
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);

  if (fd.close() != 0) throw system_error(Errc::io, errno, fmt::format("{}: close", path.string()));
  return file_bytes;
}

// Metadata key and value in every file synth writes (shard `__metadata__`, index `metadata`):
// synth replaces a file only where it finds them.
constexpr const char* synth_marker_key = "generator";
constexpr const char* synth_marker_value = "weightcast synth";

std::string shard_header(const std::vector<const TensorSpec*>& tensors, Dtype dtype) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}, {synth_marker_key, synth_marker_value}};
  for (const auto* t : tensors) {
    header[t->name] = {{"dtype", std::string(dtype_name(dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {t->data_offset, t->data_offset + t->bytes}}};
  }
  std::string text = header.dump();
  // The Python writer pads with spaces so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

bool is_synth_output_name(const std::string& name);

// Removes the temporary files (NAME.partial-PID, NAME one of synth's output names) that a
// synth no longer running left in @p out_dir: one killed (SIGKILL, a machine that went down)
// or, before, one ended by a signal, each left gigabytes that no later run removed. Those of
// a live process (another synth writing there now) are left alone, as are this process's
// own (create_temp replaces them) and those whose pid cannot be read as one. A pid of
// another PID namespace cannot be told from a dead one.
void remove_stale_partials(const std::filesystem::path& out_dir) {
  constexpr std::string_view marker = ".partial-";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.rfind(marker);
    if (at == std::string::npos || !is_synth_output_name(name.substr(0, at))) continue;
    const std::string_view digits = std::string_view(name).substr(at + marker.size());
    pid_t pid = 0;
    const auto [end, parsed] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (parsed != std::errc() || end != digits.data() + digits.size() || pid <= 0 ||
        pid == ::getpid()) {
      continue;
    }
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // running (EPERM: another user's)
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;  // synth writes regular files only
    std::filesystem::remove(entry.path(), type_ec);
  }
}

// Why @p path (a .safetensors file or an index) is not synth's own, or "" when its metadata
// says synth wrote it. Only the header is read (read_safetensors_header_text): a shard of
// synth's whose data was cut short or changed is still synth's to replace. A file that
// cannot be read as one (a FIFO, a header cut short) says why in the reader's own words.
std::string not_written_by_synth(const std::filesystem::path& path) {
  constexpr const char* no_marker = "its metadata has no \"generator\": \"weightcast synth\"";
  const std::string name = path.filename().string();
  nlohmann::json metadata;
  try {
    if (name.ends_with(".index.json")) {
      const auto index = nlohmann::json::parse(detail::read_index_text(path, name), nullptr,
                                               /*allow_exceptions=*/false);
      if (!index.is_object()) return "it is not a JSON object";
      if (index.contains("metadata")) metadata = index["metadata"];
    } else {
      const auto header = nlohmann::json::parse(read_safetensors_header_text(path, name).json,
                                                nullptr, /*allow_exceptions=*/false);
      if (!header.is_object()) return "its header is not a JSON object";
      if (header.contains("__metadata__")) metadata = header["__metadata__"];
    }
  } catch (const Error& e) {
    return e.what();
  }
  if (!metadata.is_object() || !metadata.contains(synth_marker_key) ||
      metadata[synth_marker_key] != synth_marker_value) {
    return no_marker;
  }
  return {};
}

// Before anything is written: synth replaces an earlier synthetic checkpoint in @p out_dir,
// never someone's model (it names its files as Hugging Face does: model.safetensors,
// model-00001-of-00004.safetensors), and leaves no second checkpoint beside its own.
void check_out_dir(const std::filesystem::path& out_dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(".safetensors") && !name.ends_with(".safetensors.index.json")) continue;
    if (!is_synth_output_name(name)) {
      throw Error(Errc::usage,
                  fmt::format("synth: {} already holds {}: a directory with two checkpoints "
                              "does not load; write the synthetic checkpoint to an empty "
                              "directory",
                              out_dir.string(), name));
    }
    if (const std::string why = not_written_by_synth(entry.path()); !why.empty()) {
      throw Error(Errc::usage,
                  fmt::format("synth: {} already holds {}, which weightcast synth did not "
                              "write ({}); synth replaces only its own files: write to an "
                              "empty directory",
                              out_dir.string(), name, why));
    }
  }
}

bool is_synth_output_name(const std::string& name) {
  static const std::regex pattern(
      R"(model\.safetensors|model-\d{5}-of-\d{5}\.safetensors|model\.safetensors\.index\.json)");
  return std::regex_match(name, pattern);
}

// Before anything is written: the whole checkpoint must fit in the free space of
// @p out_dir's filesystem. Each shard is reserved whole (posix_fallocate) before its data
// are generated, but shard after shard the reservations filled the disk before one failed,
// for a checkpoint that could never fit. A synthetic checkpoint being replaced is not
// counted as free: its files go only after the new ones are in place. The free space is
// what an unprivileged writer may use (f_bavail), and a refusal is 74, as running out of
// space during the write (ENOSPC) is.
void check_free_space(const std::filesystem::path& out_dir, std::uint64_t needed_bytes,
                      std::size_t files, bool at_least) {
  struct statvfs fs {};
  if (::statvfs(out_dir.c_str(), &fs) != 0) {
    throw system_error(Errc::io, errno,
                       fmt::format("{}: cannot read the filesystem's free space", out_dir.string()));
  }
  const unsigned __int128 free_wide =
      static_cast<unsigned __int128>(fs.f_bavail) * static_cast<unsigned __int128>(fs.f_frsize);
  if (free_wide >= needed_bytes) return;
  const auto free_bytes = static_cast<std::uint64_t>(free_wide);
  throw Error(Errc::io,
              fmt::format("synth: {} has {} free ({} bytes) but the checkpoint needs {}{} ({} "
                          "bytes in {} file{}); nothing was written: free space, write "
                          "elsewhere, or choose fewer --params",
                          out_dir.string(), format_bytes(free_bytes), free_bytes,
                          at_least ? "more than " : "", format_bytes(needed_bytes), needed_bytes,
                          files, files == 1 ? "" : "s"));
}

void rename_into_place(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    throw system_error(Errc::io, errno,
                       fmt::format("{}: rename to {}", from.string(), to.string()));
  }
}

}  // namespace

std::uint64_t LlamaShape::params() const noexcept {
  if (heads == 0) return 0;
  return params_outside_layers(*this) + layers * params_per_layer(*this);
}

LlamaShape choose_llama_shape(std::uint64_t target_params) {
  const ShapeRow* row = &shape_rows.front();
  for (const auto& r : shape_rows) {
    if (target_params >= r.min_params) row = &r;
  }
  LlamaShape s{row->vocab, row->hidden, row->intermediate, row->heads, row->kv_heads, 1};
  std::uint64_t fixed = params_outside_layers(s);
  std::uint64_t per_layer = params_per_layer(s);
  if (target_params > fixed) {
    s.layers = std::max<std::uint64_t>(1, (target_params - fixed + per_layer / 2) / per_layer);
  }
  return s;
}

std::uint64_t parse_param_count(std::string_view text) {
  auto fail = [&]() -> std::uint64_t {
    throw Error(Errc::usage, fmt::format("--params '{}' is not a parameter count (use e.g. "
                                         "1M, 125M, 1B, 1.5B, 8B)",
                                         text));
  };
  std::string t;
  for (char c : text) {
    if (c != ' ' && c != '_') t += c;
  }
  if (t.empty()) return fail();
  double multiplier = 1;
  switch (std::tolower(static_cast<unsigned char>(t.back()))) {
    case 'k': multiplier = 1e3; break;
    case 'm': multiplier = 1e6; break;
    case 'b':
    case 'g': multiplier = 1e9; break;
    case 't': multiplier = 1e12; break;
    default: break;
  }
  if (multiplier != 1) t.pop_back();
  if (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) {
        return (c >= '0' && c <= '9') || c == '.';
      }) || std::count(t.begin(), t.end(), '.') > 1) {
    return fail();
  }
  double value = std::strtod(t.c_str(), nullptr) * multiplier;
  if (!(value >= 1) || value > 10e12) {
    throw Error(Errc::usage, fmt::format("--params '{}' is out of range (1 to 10T)", text));
  }
  return static_cast<std::uint64_t>(std::llround(value));
}

SynthSummary write_synthetic_checkpoint(const std::filesystem::path& out_dir,
                                        const SynthOptions& options) {
  if (options.params == 0) throw Error(Errc::usage, "synth: params must be more than 0");
  if (options.shard_bytes == 0) throw Error(Errc::usage, "synth: shard size must be more than 0");
  if (out_dir.empty()) throw Error(Errc::usage, "synth: the output directory path is empty");
  detail::expect_path_without_nul(out_dir, "synth: the output directory");

  SynthSummary summary;
  summary.shape = choose_llama_shape(options.params);
  std::vector<TensorSpec> tensors = llama_tensors(summary.shape, options.dtype);

  // Greedy sharding in model order, as transformers' `shard_checkpoint` does: start a new
  // shard when the next tensor would push this one past shard_bytes.
  std::vector<std::vector<const TensorSpec*>> shards(1);
  std::uint64_t shard_fill = 0;
  for (auto& t : tensors) {
    if (!shards.back().empty() && shard_fill + t.bytes > options.shard_bytes) {
      shards.emplace_back();
      shard_fill = 0;
    }
    t.shard = static_cast<std::uint32_t>(shards.size() - 1);
    t.data_offset = shard_fill;
    shard_fill += t.bytes;
    shards.back().push_back(&t);
    summary.params += t.elements;
    summary.tensor_bytes += t.bytes;
  }
  summary.tensors = tensors.size();
  summary.shards = shards.size();

  std::error_code ec;
  // A dangling symbolic link: create_directories says only "File exists".
  if (std::filesystem::is_symlink(out_dir, ec) && !std::filesystem::exists(out_dir, ec)) {
    throw Error(Errc::usage,
                fmt::format("synth: {} is a symbolic link to {}, which does not exist: create "
                            "that directory first, or give another path",
                            out_dir.string(), std::filesystem::read_symlink(out_dir, ec).string()));
  }
  const bool created = std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    throw Error(Errc::io, fmt::format("{}: cannot create directory: {}", out_dir.string(),
                                      ec.message()));
  }
  // One synth at a time per directory: two at once each removed the other's finished files
  // at the end, and both exited 0 with a checkpoint whose index named missing shards. The
  // lock is the directory's own (flock(2)), released when this process ends however it ends.
  UniqueFd dir_lock(::open(out_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_lock.get() < 0) {
    throw system_error(Errc::io, errno, fmt::format("{}: cannot open directory", out_dir.string()));
  }
  if (::flock(dir_lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      throw Error(Errc::usage, fmt::format("synth: {} is being written by another weightcast "
                                           "synth; wait for it, or write elsewhere",
                                           out_dir.string()));
    }
    throw system_error(Errc::io, errno, fmt::format("{}: cannot lock directory", out_dir.string()));
  }
  check_out_dir(out_dir);
  remove_stale_partials(out_dir);

  std::vector<std::string> names;
  if (shards.size() == 1) {
    names.push_back("model.safetensors");
  } else {
    for (std::size_t i = 0; i < shards.size(); ++i) {
      names.push_back(fmt::format("model-{:05}-of-{:05}.safetensors", i + 1, shards.size()));
    }
  }
  std::string temp_suffix = fmt::format(".partial-{}", ::getpid());

  const std::size_t files = shards.size() + (shards.size() > 1 ? 1 : 0);
  // The tensor bytes alone first: a checkpoint far too large is refused before its headers
  // (a 10T-parameter one has 11,687 shards) are built.
  const auto refuse_if_full = [&](std::uint64_t needed_bytes, bool at_least) {
    try {
      check_free_space(out_dir, needed_bytes, files, at_least);
    } catch (const Error&) {
      if (created) std::filesystem::remove(out_dir, ec);  // empty: leave nothing behind
      throw;
    }
  };
  refuse_if_full(summary.tensor_bytes, true);
  std::vector<std::string> headers;
  std::uint64_t needed_bytes = 0;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    headers.push_back(shard_header(shards[i], options.dtype));
    needed_bytes += 8 + headers.back().size();
    for (const auto* t : shards[i]) needed_bytes += t->bytes;
  }
  std::string index_name = "model.safetensors.index.json";
  std::string index_text;
  if (shards.size() > 1) {
    nlohmann::json index;
    index["metadata"] = {{"total_size", summary.tensor_bytes},
                         {synth_marker_key, synth_marker_value}};
    nlohmann::json weight_map = nlohmann::json::object();
    for (const auto& t : tensors) weight_map[t.name] = names[t.shard];
    index["weight_map"] = std::move(weight_map);
    index_text = index.dump(2) + "\n";
    needed_bytes += index_text.size();
  }
  refuse_if_full(needed_bytes, false);

  TempFiles temps;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    throw_if_stopped(options.stop);
    auto temp = out_dir / (names[i] + temp_suffix);
    temps.add(temp);
    summary.file_bytes += write_shard(temp, headers[i], shards[i], options);
  }

  if (shards.size() > 1) {
    const std::string& text = index_text;
    auto temp = out_dir / (index_name + temp_suffix);
    temps.add(temp);
    UniqueFd fd(create_temp(temp));
    pwrite_all(fd.get(), reinterpret_cast<const std::byte*>(text.data()), text.size(), 0, temp);
    if (fd.close() != 0) throw system_error(Errc::io, errno, fmt::format("{}: close", temp.string()));
    summary.file_bytes += text.size();
  }

  throw_if_stopped(options.stop);  // the last chance: from here the write completes
  // Commit: drop an old index first (so it never names a mix of old and new shards), move
  // the shards into place, the index last, then remove what remains of an older checkpoint.
  std::filesystem::remove(out_dir / index_name, ec);
  std::set<std::string> written(names.begin(), names.end());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    rename_into_place(out_dir / (names[i] + temp_suffix), out_dir / names[i]);
    summary.paths.push_back(out_dir / names[i]);
  }
  if (shards.size() > 1) {
    rename_into_place(out_dir / (index_name + temp_suffix), out_dir / index_name);
    summary.paths.push_back(out_dir / index_name);
    written.insert(index_name);
  }
  temps.dismiss();
  for (const auto& entry : std::filesystem::directory_iterator(out_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (is_synth_output_name(name) && written.count(name) == 0) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  summary.checkpoint = shards.size() > 1 ? out_dir / index_name : out_dir / names[0];
  return summary;
}

}  // namespace weightcast
