// `weightcast synth OUT_DIR [--params 1B] [--dtype BF16] [--shard-size 2GiB] [--seed 0]`
#include "commands.hpp"

#include "weightcast/config.hpp"
#include "weightcast/dtype.hpp"
#include "weightcast/error.hpp"
#include "weightcast/synth.hpp"

#include <fmt/core.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <string>

namespace weightcast::cli {

namespace {

Dtype parse_dtype_arg(const std::string& name) {
  if (auto dtype = parse_dtype(name)) return *dtype;
  std::string known;
  for (std::size_t i = 0; i < dtype_count; ++i) {
    if (!known.empty()) known += ", ";
    known += dtype_name(static_cast<Dtype>(i));
  }
  throw Error(Errc::usage, fmt::format("--dtype '{}' is not a safetensors dtype (one of: {})",
                                       name, known));
}

std::uint64_t parse_shard_size_arg(const std::string& text) {
  try {
    return parse_size(text, "--shard-size");
  } catch (const Error& e) {
    // A command-line argument, not a config key: the exit status is usage's.
    throw Error(Errc::usage, e.what());
  }
}

}  // namespace

std::optional<std::uint64_t> parse_seed(std::string_view text) {
  std::uint64_t seed = 0;
  const char* end = text.data() + text.size();
  const auto [at, ec] = std::from_chars(text.data(), end, seed);
  if (text.empty() || ec != std::errc() || at != end) return std::nullopt;
  return seed;
}

int synth(const SynthArgs& args) {
  SynthOptions options;
  options.params = parse_param_count(args.params);
  options.dtype = parse_dtype_arg(args.dtype);
  options.shard_bytes = parse_shard_size_arg(args.shard_size);
  const auto seed = parse_seed(args.seed);
  if (!seed) throw Error(Errc::usage, fmt::format("--seed {}: not a whole number", args.seed));
  options.seed = *seed;
  if (options.shard_bytes == 0) throw Error(Errc::usage, "--shard-size must be more than 0");

  auto shape = choose_llama_shape(options.params);
  fmt::print("synth: {} layers, hidden {}, intermediate {}, heads {}/{} kv, vocab {}, {}\n",
             shape.layers, shape.hidden, shape.intermediate, shape.heads, shape.kv_heads,
             shape.vocab, dtype_name(options.dtype));
  flush_stdout();  // before the checkpoint is written, not after

  auto start = std::chrono::steady_clock::now();
  SynthSummary summary = write_synthetic_checkpoint(args.out_dir, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  fmt::print("synth: wrote {}\n", summary.checkpoint.string());
  fmt::print("synth: {} tensors, {} shard{}, {:.3f}e9 params, {} bytes ({})\n", summary.tensors,
             summary.shards, summary.shards == 1 ? "" : "s",
             static_cast<double>(summary.params) / 1e9, summary.file_bytes,
             format_bytes(summary.file_bytes));
  // 1 GB = 1e9 B, as in every throughput weightcast reports.
  fmt::print("synth: {:.3f} s, {:.2f} GB/s\n", seconds,
             seconds > 0 ? static_cast<double>(summary.file_bytes) / seconds / 1e9 : 0.0);
  return 0;
}

}  // namespace weightcast::cli
