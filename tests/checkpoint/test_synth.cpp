// Synthetic checkpoints: read back with an independent minimal parser (8-byte length, JSON
// header via nlohmann::json), sharding and index, determinism, and open_checkpoint.
#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/core/error.hpp"
#include "weightcast/checkpoint/synth.hpp"

#include "support/expect_error.hpp"
#include "support/job.hpp"
#include "support/paths.hpp"
#include "support/process.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <csignal>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <tuple>
#include <unistd.h>

using namespace weightcast;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using weightcast::test::expect_error;

namespace {

std::string read_all(const fs::path& path) {
  REQUIRE(fs::is_regular_file(path));
  return weightcast::test::read_file(path);
}

struct ParsedTensor {
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct ParsedShard {
  std::uint64_t header_bytes = 0;
  nlohmann::json metadata;
  std::map<std::string, ParsedTensor> tensors;
  std::string bytes;  // the whole file

  /// The bytes of tensor @p name.
  [[nodiscard]] std::string tensor_bytes(const std::string& name) const {
    const auto& t = tensors.at(name);
    return bytes.substr(8 + header_bytes + t.begin, t.end - t.begin);
  }
};

/// Parses a safetensors file without weightcast's parser, checking that the tensors tile the
/// data section exactly and that each size matches its shape for @p bits_per_element.
ParsedShard parse_shard(const fs::path& path, std::uint64_t bits_per_element) {
  ParsedShard shard;
  shard.bytes = read_all(path);
  REQUIRE(shard.bytes.size() >= 8);
  std::memcpy(&shard.header_bytes, shard.bytes.data(), 8);
  CHECK(shard.header_bytes % 8 == 0);  // padded like the Python writer
  REQUIRE(8 + shard.header_bytes <= shard.bytes.size());
  std::string header_text = shard.bytes.substr(8, shard.header_bytes);
  auto header = nlohmann::json::parse(header_text);  // trailing spaces are JSON whitespace
  REQUIRE(header.is_object());

  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      shard.metadata = entry;
      continue;
    }
    ParsedTensor t;
    t.dtype = entry.at("dtype").get<std::string>();
    t.shape = entry.at("shape").get<std::vector<std::uint64_t>>();
    t.begin = entry.at("data_offsets").at(0).get<std::uint64_t>();
    t.end = entry.at("data_offsets").at(1).get<std::uint64_t>();
    std::uint64_t elements = 1;
    for (auto d : t.shape) elements *= d;
    INFO(name);
    CHECK(t.end - t.begin == elements * bits_per_element / 8);
    ranges.emplace_back(t.begin, t.end);
    CHECK(shard.tensors.emplace(name, t).second);
  }
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t expected_begin = 0;
  for (const auto& [begin, end] : ranges) {
    CHECK(begin == expected_begin);
    expected_begin = end;
  }
  CHECK(8 + shard.header_bytes + expected_begin == shard.bytes.size());
  return shard;
}

/// Expected tensor names and shapes for @p s, independent of the writer's own list.
std::map<std::string, std::vector<std::uint64_t>> expected_tensors(const LlamaShape& s) {
  std::map<std::string, std::vector<std::uint64_t>> out;
  std::uint64_t kv = s.kv_heads * (s.hidden / s.heads);
  out["model.embed_tokens.weight"] = {s.vocab, s.hidden};
  out["lm_head.weight"] = {s.vocab, s.hidden};
  out["model.norm.weight"] = {s.hidden};
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    out[p + "self_attn.q_proj.weight"] = {s.hidden, s.hidden};
    out[p + "self_attn.k_proj.weight"] = {kv, s.hidden};
    out[p + "self_attn.v_proj.weight"] = {kv, s.hidden};
    out[p + "self_attn.o_proj.weight"] = {s.hidden, s.hidden};
    out[p + "mlp.gate_proj.weight"] = {s.intermediate, s.hidden};
    out[p + "mlp.up_proj.weight"] = {s.intermediate, s.hidden};
    out[p + "mlp.down_proj.weight"] = {s.hidden, s.intermediate};
    out[p + "input_layernorm.weight"] = {s.hidden};
    out[p + "post_attention_layernorm.weight"] = {s.hidden};
  }
  return out;
}

std::set<std::string> dir_listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

}  // namespace

TEST_CASE("synth: parameter counts parse", "[synth]") {
  CHECK(parse_param_count("1M") == 1'000'000);
  CHECK(parse_param_count("125M") == 125'000'000);
  CHECK(parse_param_count("1B") == 1'000'000'000);
  CHECK(parse_param_count("1.5B") == 1'500'000'000);
  CHECK(parse_param_count("8b") == 8'000'000'000);
  CHECK(parse_param_count("500K") == 500'000);
  CHECK(parse_param_count("12345") == 12345);
  for (const char* bad : {"", "B", "1X", "-1B", "1.2.3M", "0", "0M", "20T", "abc"}) {
    INFO(bad);
    auto e = expect_error([&] { parse_param_count(bad); });
    CHECK(e.code() == Errc::usage);
    CHECK_THAT(e.what(), Contains(std::string("'") + bad + "'"));
  }
}

TEST_CASE("synth: shapes come close to the target parameter count", "[synth]") {
  struct Case {
    std::uint64_t target;
    double lo, hi;  // accepted params / target
  };
  for (const auto& c : {Case{1'000'000, 0.9, 1.1}, Case{10'000'000, 0.9, 1.1},
                        Case{125'000'000, 0.9, 1.1}, Case{1'000'000'000, 1.0, 1.3},
                        Case{8'000'000'000, 0.95, 1.05}, Case{70'000'000'000, 0.95, 1.05}}) {
    auto s = choose_llama_shape(c.target);
    INFO("target " << c.target << ": " << s.layers << " layers, hidden " << s.hidden << ", "
                   << s.params() << " params");
    double ratio = static_cast<double>(s.params()) / static_cast<double>(c.target);
    CHECK(ratio >= c.lo);
    CHECK(ratio <= c.hi);
    CHECK(s.hidden % s.heads == 0);
    CHECK(s.heads % s.kv_heads == 0);
    CHECK(s.layers >= 1);
  }
  auto llama8b = choose_llama_shape(8'000'000'000);
  CHECK(llama8b.hidden == 4096);
  CHECK(llama8b.layers == 32);
  CHECK(llama8b.kv_heads == 8);
  CHECK(choose_llama_shape(1).layers == 1);  // tiny targets still give a whole model
}

TEST_CASE("synth: a single-file checkpoint parses independently", "[synth]") {
  test::TempDir dir;
  auto out = dir.path() / "ckpt";  // created by the writer
  SynthOptions options{1'000'000, Dtype::BF16, 1ull << 30, 7};
  auto summary = write_synthetic_checkpoint(out, options);

  CHECK(summary.shards == 1);
  CHECK(summary.checkpoint == out / "model.safetensors");
  REQUIRE(summary.paths.size() == 1);
  CHECK(dir_listing(out) == std::set<std::string>{"model.safetensors"});

  auto shard = parse_shard(summary.checkpoint, 16);
  CHECK(shard.metadata == nlohmann::json{{"format", "pt"}, {"generator", "weightcast synth"}});
  auto expected = expected_tensors(summary.shape);
  CHECK(summary.tensors == expected.size());
  CHECK(shard.tensors.size() == expected.size());
  std::uint64_t params = 0;
  for (const auto& [name, shape] : expected) {
    INFO(name);
    REQUIRE(shard.tensors.count(name) == 1);
    CHECK(shard.tensors.at(name).shape == shape);
    CHECK(shard.tensors.at(name).dtype == "BF16");
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    params += n;
  }
  CHECK(summary.params == params);
  CHECK(summary.params == summary.shape.params());
  CHECK(summary.tensor_bytes == 2 * params);
  CHECK(summary.file_bytes == fs::file_size(summary.checkpoint));

  // Distinct tensors of equal shape hold distinct bytes; bytes are not all zero.
  auto q0 = shard.tensor_bytes("model.layers.0.self_attn.q_proj.weight");
  auto o0 = shard.tensor_bytes("model.layers.0.self_attn.o_proj.weight");
  auto q1 = shard.tensor_bytes("model.layers.1.self_attn.q_proj.weight");
  CHECK(q0 != o0);
  CHECK(q0 != q1);
  CHECK(q0 != std::string(q0.size(), '\0'));
}

TEST_CASE("synth: sharding writes an index whose weight_map covers every tensor once",
          "[synth]") {
  test::TempDir dir;
  SynthOptions options{10'000'000, Dtype::BF16, 4ull << 20, 3};
  auto summary = write_synthetic_checkpoint(dir.path(), options);
  REQUIRE(summary.shards > 1);
  auto index_path = dir.path() / "model.safetensors.index.json";
  CHECK(summary.checkpoint == index_path);
  CHECK(summary.paths.size() == summary.shards + 1);

  auto index = nlohmann::json::parse(read_all(index_path));
  auto weight_map = index.at("weight_map").get<std::map<std::string, std::string>>();
  auto expected = expected_tensors(summary.shape);
  CHECK(weight_map.size() == expected.size());

  std::set<std::string> files;
  for (const auto& [name, file] : weight_map) files.insert(file);
  CHECK(files.size() == summary.shards);
  std::set<std::string> listing = dir_listing(dir.path());
  std::set<std::string> want{"model.safetensors.index.json"};
  for (std::uint64_t i = 1; i <= summary.shards; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05llu-of-%05llu.safetensors",
                  static_cast<unsigned long long>(i),
                  static_cast<unsigned long long>(summary.shards));
    CHECK(files.count(name) == 1);
    want.insert(name);
  }
  CHECK(listing == want);  // no temporary files left behind

  // Every tensor is in exactly one shard, the one the index names; sizes add up.
  std::map<std::string, int> seen;
  std::uint64_t total = 0;
  for (const auto& file : files) {
    auto shard = parse_shard(dir.path() / file, 16);
    std::uint64_t shard_bytes = 0;
    for (const auto& [name, t] : shard.tensors) {
      ++seen[name];
      CHECK(weight_map.at(name) == file);
      CHECK(t.shape == expected.at(name));
      shard_bytes += t.end - t.begin;
    }
    total += shard_bytes;
    // A shard exceeds shard_bytes only when it is a single tensor larger than that.
    CHECK((shard_bytes <= options.shard_bytes || shard.tensors.size() == 1));
  }
  CHECK(seen.size() == expected.size());
  for (const auto& [name, count] : seen) CHECK(count == 1);
  CHECK(index.at("metadata").at("total_size").get<std::uint64_t>() == total);
  CHECK(total == summary.tensor_bytes);
}

TEST_CASE("synth: bytes are deterministic for a seed and independent of sharding", "[synth]") {
  test::TempDir dir;
  SynthOptions options{1'000'000, Dtype::BF16, 1ull << 30, 42};
  auto a = write_synthetic_checkpoint(dir / "a", options);
  auto b = write_synthetic_checkpoint(dir / "b", options);
  CHECK(read_all(a.checkpoint) == read_all(b.checkpoint));

  options.seed = 43;
  auto c = write_synthetic_checkpoint(dir / "c", options);
  auto pa = parse_shard(a.checkpoint, 16);
  auto pc = parse_shard(c.checkpoint, 16);
  CHECK(pa.tensor_bytes("lm_head.weight") != pc.tensor_bytes("lm_head.weight"));

  options.seed = 42;
  options.shard_bytes = 256 << 10;
  auto sharded = write_synthetic_checkpoint(dir / "s", options);
  REQUIRE(sharded.shards > 1);
  auto index = nlohmann::json::parse(read_all(sharded.checkpoint));
  std::map<std::string, ParsedShard> shards;
  for (const auto& [name, file] : index.at("weight_map").items()) {
    auto f = file.get<std::string>();
    if (shards.count(f) == 0) shards.emplace(f, parse_shard(dir / "s" / f, 16));
    INFO(name);
    CHECK(shards.at(f).tensor_bytes(name) == pa.tensor_bytes(name));
  }
}

TEST_CASE("synth: sub-byte and wide dtypes", "[synth]") {
  test::TempDir dir;
  for (auto [dtype, bits] : {std::pair{Dtype::F4, 4}, std::pair{Dtype::F6_E2M3, 6},
                             std::pair{Dtype::F32, 32}, std::pair{Dtype::U8, 8}}) {
    INFO(dtype_name(dtype));
    auto out = dir / std::string(dtype_name(dtype));
    auto summary = write_synthetic_checkpoint(out, {100'000, dtype, 1ull << 30, 1});
    auto shard = parse_shard(summary.checkpoint, static_cast<std::uint64_t>(bits));
    CHECK(summary.tensor_bytes * 8 == summary.params * static_cast<std::uint64_t>(bits));
    CHECK(shard.tensors.at("lm_head.weight").dtype == std::string(dtype_name(dtype)));
  }
}

TEST_CASE("synth: BOOL tensors hold only 0 and 1, bytes numpy and torch can read as bool",
          "[synth]") {
  test::TempDir dir;
  auto summary = write_synthetic_checkpoint(dir / "b", {100'000, Dtype::BOOL, 1ull << 30, 7});
  auto shard = parse_shard(summary.checkpoint, 8);
  std::set<unsigned char> seen;
  for (const auto& [name, tensor] : shard.tensors) {
    for (char c : shard.tensor_bytes(name)) seen.insert(static_cast<unsigned char>(c));
  }
  CHECK(seen == std::set<unsigned char>{0, 1});  // both, and nothing else
}

TEST_CASE("synth: rewriting a directory leaves exactly one checkpoint", "[synth]") {
  test::TempDir dir;
  // A file that is not ours survives.
  std::ofstream(dir / "README.md") << "mine\n";
  write_synthetic_checkpoint(dir.path(), {10'000'000, Dtype::BF16, 4ull << 20, 0});
  CHECK(dir_listing(dir.path()).count("model.safetensors.index.json") == 1);
  auto single = write_synthetic_checkpoint(dir.path(), {1'000'000, Dtype::BF16, 1ull << 30, 0});
  CHECK(single.shards == 1);
  CHECK(dir_listing(dir.path()) == std::set<std::string>{"README.md", "model.safetensors"});
}

TEST_CASE("synth: a directory holding someone else's checkpoint is refused, nothing removed",
          "[synth]") {
  // Hugging Face's own names, which synth also writes: it used to remove them silently.
  const auto real = weightcast::test::small_checkpoint();
  for (const std::string name : {"model.safetensors", "model-00001-of-00002.safetensors",
                                 "weights.safetensors"}) {
    INFO(name);
    test::TempDir dir;
    fs::copy_file(real, dir / name);
    std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {}})";
    auto e = expect_error(
        [&] { write_synthetic_checkpoint(dir.path(), {1'000'000, Dtype::BF16, 1 << 20, 0}); });
    CHECK(e.code() == Errc::usage);
    CHECK_THAT(e.what(), Contains(dir.path().string()) && Contains("empty directory"));
    CHECK(dir_listing(dir.path()) ==
          std::set<std::string>{name, "model.safetensors.index.json"});
  }
}

TEST_CASE("synth: its own shard, cut short or damaged after the header, is replaced",
          "[synth]") {
  // synth opened each file as a checkpoint to find its marker: a truncated shard of its own
  // failed that and was refused as "its metadata has no generator", which was false.
  test::TempDir dir;
  const auto first = write_synthetic_checkpoint(dir.path(), {10'000'000, Dtype::BF16, 4ull << 20, 0});
  REQUIRE(first.shards > 1);
  const auto last = first.paths.at(first.shards - 1);
  fs::resize_file(last, 4096);
  const auto again = write_synthetic_checkpoint(dir.path(), {10'000'000, Dtype::BF16, 4ull << 20, 0});
  CHECK(open_checkpoint(dir.path()).tensors.size() == again.tensors);
  // A file whose header is gone is not known to be synth's: refused, saying why.
  fs::resize_file(last, 100);
  auto e = expect_error(
      [&] { write_synthetic_checkpoint(dir.path(), {10'000'000, Dtype::BF16, 4ull << 20, 0}); });
  CHECK(e.code() == Errc::usage);
  CHECK_THAT(e.what(), Contains(last.filename().string()) &&
                           Contains("runs past the end of the file") &&
                           !Contains("no \"generator\""));
  // Someone else's file still says what it lacks.
  test::TempDir other;
  fs::copy_file(weightcast::test::small_checkpoint(),
                other / "model.safetensors");
  e = expect_error(
      [&] { write_synthetic_checkpoint(other.path(), {1'000'000, Dtype::BF16, 1 << 20, 0}); });
  CHECK_THAT(e.what(), Contains("its metadata has no \"generator\": \"weightcast synth\""));
}

TEST_CASE("synth: a FIFO named as one of its outputs is refused at once, not waited on",
          "[synth]") {
  // Its marker check opened the file with std::ifstream, which blocks on a FIFO with no
  // writer: synth hung before writing anything.
  for (const std::string name : {"model.safetensors", "model-00001-of-00002.safetensors",
                                 "model.safetensors.index.json"}) {
    INFO(name);
    test::TempDir dir;
    REQUIRE(::mkfifo((dir / name).c_str(), 0600) == 0);
    auto e = expect_error(
        [&] { write_synthetic_checkpoint(dir.path(), {1'000'000, Dtype::BF16, 1 << 20, 0}); });
    CHECK(e.code() == Errc::usage);
    CHECK_THAT(e.what(), Contains(name + ", which weightcast synth did not write (" + name +
                                  ": is a FIFO"));
    CHECK(dir_listing(dir.path()) == std::set<std::string>{name});
  }
}

TEST_CASE("synth: a directory another synth is writing is refused, nothing touched",
          "[synth]") {
  // Two at once each removed the other's files at the end: both exited 0, and the index
  // named shards that were gone.
  test::TempDir dir;
  const auto first = write_synthetic_checkpoint(dir.path(), {1'000'000, Dtype::BF16, 1 << 20, 0});
  const auto before = dir_listing(dir.path());
  const int held = ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);  // as a running synth holds it
  auto e = expect_error(
      [&] { write_synthetic_checkpoint(dir.path(), {2'000'000, Dtype::BF16, 1 << 20, 0}); });
  ::close(held);
  CHECK(e.code() == Errc::usage);
  CHECK_THAT(e.what(), Contains("is being written by another weightcast synth"));
  CHECK(dir_listing(dir.path()) == before);
  CHECK(open_checkpoint(first.checkpoint).tensors.size() == first.tensors);
}

TEST_CASE("synth: an output directory that is a dangling symlink says so", "[synth]") {
  // It said "cannot create directory: File exists".
  test::TempDir dir;
  fs::create_directory_symlink(dir / "missing", dir / "out");
  auto e = expect_error(
      [&] { write_synthetic_checkpoint(dir / "out", {1'000'000, Dtype::BF16, 1 << 20, 0}); });
  CHECK(e.code() == Errc::usage);
  CHECK_THAT(e.what(), Contains("out is a symbolic link to " + (dir / "missing").string() +
                                ", which does not exist"));
}

TEST_CASE("synth: errors", "[synth]") {
  test::TempDir dir;
  auto e = expect_error(
      [&] { write_synthetic_checkpoint(dir.path(), {1'000'000, Dtype::BF16, 0, 0}); });
  CHECK(e.code() == Errc::usage);
  CHECK(expect_error([&] {
          write_synthetic_checkpoint(dir.path(), {0, Dtype::BF16, 1 << 20, 0});
        }).code() == Errc::usage);
  // An empty path: not an internal error from the filesystem library.
  auto empty = expect_error(
      [&] { write_synthetic_checkpoint("", {1'000'000, Dtype::BF16, 1 << 20, 0}); });
  CHECK(empty.code() == Errc::usage);
  CHECK(std::string(empty.what()) == "synth: the output directory path is empty");

  // The output directory is a file: an I/O error naming it.
  auto blocker = dir / "not-a-dir";
  std::ofstream(blocker) << "x";
  auto io = expect_error(
      [&] { write_synthetic_checkpoint(blocker / "out", {1'000'000, Dtype::BF16, 1 << 20, 0}); });
  CHECK(io.code() == Errc::io);
  CHECK_THAT(io.what(), Contains("not-a-dir"));

  if (::geteuid() != 0) {  // root writes anywhere; the check is meaningless there
    fs::create_directory(dir / "ro");
    fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
    auto denied = expect_error(
        [&] { write_synthetic_checkpoint(dir / "ro", {1'000'000, Dtype::BF16, 1 << 20, 0}); });
    CHECK(denied.code() == Errc::io);
    CHECK_THAT(denied.what(), Contains("ro/model.safetensors"));
    fs::permissions(dir / "ro", fs::perms::owner_all);
  }
}

namespace {

/// A tmpfs of @p size mounted at @p dir for the test's lifetime (a filesystem of known,
/// small free space); `mounted()` is false where mount(2) is not permitted (not root, or a
/// container without CAP_SYS_ADMIN), with the reason.
class SmallFilesystem {
 public:
  SmallFilesystem(const fs::path& dir, const std::string& size) : _dir(dir) {
    fs::create_directories(dir);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0) {
      _mounted = true;
    } else {
      _why = fmt::format("mount -t tmpfs -o size={} is not permitted here ({})", size,
                         std::strerror(errno));
    }
  }
  ~SmallFilesystem() {
    if (_mounted) ::umount2(_dir.c_str(), MNT_DETACH);
  }
  SmallFilesystem(const SmallFilesystem&) = delete;
  SmallFilesystem& operator=(const SmallFilesystem&) = delete;
  [[nodiscard]] bool mounted() const noexcept { return _mounted; }
  [[nodiscard]] const std::string& why() const noexcept { return _why; }

 private:
  fs::path _dir;
  bool _mounted = false;
  std::string _why;
};

}  // namespace

TEST_CASE("synth: a checkpoint larger than the free space is refused before anything is "
          "written, naming both",
          "[synth]") {
  test::TempDir dir;
  SmallFilesystem small(dir / "small", "4m");
  if (!small.mounted()) {
    WARN("skipped: " << small.why());
    return;
  }
  SECTION("the library: 74, and no block written") {
    // 20 MB of BF16 in 1 MiB shards: reserving shard after shard, the old code wrote three
    // shards' blocks before the fourth reservation failed.
    SynthOptions options{10'000'000, Dtype::BF16, 1 << 20, 0};
    std::atomic<std::uint64_t> blocks{0};  // on_block runs on the writing threads
    options.on_block = [&](std::uint64_t) { ++blocks; };
    const auto e = expect_error([&] { write_synthetic_checkpoint(dir / "small" / "out", options); });
    INFO(e.what());
    CHECK(e.code() == Errc::io);
    CHECK_THAT(e.what(), Contains((dir / "small" / "out").string() + " has 4 MiB free (4194304 "
                                  "bytes) but the checkpoint needs ") &&
                             Contains("nothing was written"));
    CHECK(blocks == 0);
    CHECK(!fs::exists(dir / "small" / "out"));  // the directory it created is gone too
  }
  SECTION("the CLI: --params 10T exits 74 at once") {
    fs::create_directory(dir / "small" / "out");
    const auto r = test::run_cli({"synth", (dir / "small" / "out").string(), "--params", "10T"});
    INFO(r.out << r.err);
    CHECK(r.exit_status == 74);
    CHECK_THAT(r.err, Contains("has 4 MiB free") && Contains("TiB") && Contains("needs"));
    CHECK(dir_listing(dir / "small" / "out").empty());
  }
}

TEST_CASE("synth: output opens with open_checkpoint", "[synth]") {
  test::TempDir dir;
  auto single = write_synthetic_checkpoint(dir / "one", {1'000'000, Dtype::BF16, 1ull << 30, 5});
  auto sharded = write_synthetic_checkpoint(dir / "many", {10'000'000, Dtype::BF16, 4ull << 20, 5});
  for (const auto& s : {single, sharded}) {
    for (const auto& path : {s.checkpoint, s.checkpoint.parent_path()}) {
      INFO(path.string());
      Catalogue catalogue = open_checkpoint(path);
      CHECK(catalogue.tensors.size() == s.tensors);
      CHECK(catalogue.shards.size() == s.shards);
      CHECK(catalogue.total_bytes() == s.tensor_bytes);
    }
  }
}

TEST_CASE("synth: the CLI writes a checkpoint and refuses bad arguments", "[synth]") {
  test::TempDir dir;
  auto ok = test::run_cli({"synth", (dir / "c").string(), "--params", "1M", "--shard-size",
                           "1MiB", "--seed", "9"});
  INFO(ok.out << ok.err);
  CHECK(ok.exit_status == 0);
  CHECK_THAT(ok.out, Contains("tensors") && Contains("GB/s"));
  // The parameter count as model sizes are written, and exactly: not "0.001e9 params".
  CHECK_THAT(ok.out, Catch::Matchers::Matches(
                         R"((.|\n)*synth: \d+ tensors, \d+ shards, \d+(\.\d+)?[KM] params \(\d{6,7}\), (.|\n)*)"));
  CHECK(fs::exists(dir / "c" / "model.safetensors.index.json"));

  auto bad_params = test::run_cli({"synth", (dir / "d").string(), "--params", "lots"});
  CHECK(bad_params.exit_status == 64);
  CHECK_THAT(bad_params.err, Contains("'lots'"));
  auto bad_dtype = test::run_cli({"synth", (dir / "d").string(), "--dtype", "Q4"});
  CHECK(bad_dtype.exit_status == 64);
  auto bad_size = test::run_cli({"synth", (dir / "d").string(), "--shard-size", "2G"});
  CHECK(bad_size.exit_status == 64);
  CHECK_THAT(bad_size.err, Contains("ambiguous"));
  CHECK(!fs::exists(dir / "d"));
}

TEST_CASE("synth: SIGTERM or SIGINT removes its temporary files and exits 128 + signal",
          "[synth][signal]") {
  // Ended by the signal's default action, synth left a NAME.partial-PID of every shard it
  // had begun: gigabytes for a large checkpoint, which no later run removed.
  using Catch::Matchers::EndsWith;
  test::TempDir dir;
  // An earlier checkpoint in the directory stays whole: nothing is renamed into place.
  write_synthetic_checkpoint(dir.path(), {10'000'000, Dtype::BF16, 4ull << 20, 1});
  const auto before = dir_listing(dir.path());
  const std::string first_shard = read_all(dir / "model-00001-of-00005.safetensors");
  for (const auto& [sig, name, status] :
       {std::tuple{SIGTERM, "SIGTERM", 143}, std::tuple{SIGINT, "SIGINT", 130}}) {
    INFO(name);
    // 200 ms after each 4 MiB block: unstopped, the write would take a second more.
    test::BackgroundJob job({test::cli_path().string(), "synth", dir.path().string(),
                             "--params", "10M", "--shard-size", "4MiB", "--seed", "2"},
                            {"WEIGHTCAST_TEST_SYNTH_BLOCK_DELAY_MS=200"});
    REQUIRE(job.wait_for_output("the first block was written", 60));
    REQUIRE(::kill(job.pid(), sig) == 0);
    const auto r = job.wait(60);
    INFO(r.out);
    CHECK(r.term_signal == 0);  // it ended itself, not by the signal's default action
    CHECK(r.exit_status == status);
    CHECK_THAT(r.out, EndsWith("weightcast: error: interrupted by " + std::string(name) +
                               " while writing the checkpoint\n"));
    CHECK(dir_listing(dir.path()) == before);  // no .partial-PID left
    CHECK(read_all(dir / "model-00001-of-00005.safetensors") == first_shard);
  }
}

TEST_CASE("synth: temporary files of a synth that no longer runs are removed and a live one's "
          "are kept", "[synth]") {
  // A synth killed (SIGKILL, a machine that went down) leaves its NAME.partial-PID files; a
  // later synth into the same directory kept them, gigabytes each.
  test::TempDir dir;
  // A pid that no process holds: a child that has ended and been reaped.
  const pid_t dead = ::fork();
  REQUIRE(dead >= 0);
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  test::BackgroundJob live({"sleep", "60"});
  const std::string dead_suffix = ".partial-" + std::to_string(dead);
  const std::string live_suffix = ".partial-" + std::to_string(live.pid());
  for (const std::string name : {"model.safetensors", "model-00001-of-00003.safetensors",
                                 "model.safetensors.index.json"}) {
    std::ofstream(dir / (name + dead_suffix)) << "stale";
    std::ofstream(dir / (name + live_suffix)) << "being written";
  }
  // Not synth's names, or not a pid: not synth's to remove.
  std::ofstream(dir / ("notes.txt" + dead_suffix)) << "mine";
  std::ofstream(dir / "model.safetensors.partial-x") << "mine";
  write_synthetic_checkpoint(dir.path(), {1'000'000, Dtype::BF16, 1ull << 30, 0});
  CHECK(dir_listing(dir.path()) ==
        std::set<std::string>{"model.safetensors", "model.safetensors" + live_suffix,
                              "model-00001-of-00003.safetensors" + live_suffix,
                              "model.safetensors.index.json" + live_suffix,
                              "notes.txt" + dead_suffix, "model.safetensors.partial-x"});
}
