// `weightcast inspect PATH`, run as a process.
#include "support/paths.hpp"
#include "support/process.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>

#include <string>

namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

}  // namespace

TEST_CASE("inspect: a real file lists its tensors and says valid", "[cli][inspect]") {
  auto file = weightcast::test::corpus_dir() / "real" / "CoffeeVampir3__Model-Saving-Test-Repo" /
              "model.safetensors";
  auto result = weightcast::test::run_cli({"inspect", file.string()});
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  CHECK(result.exit_status == 0);
  CHECK(result.err.empty());
  CHECK_THAT(result.out, StartsWith("NAME"));
  // One row per tensor: name, dtype, shape, bytes, shard (manifest: 4 F32 tensors).
  CHECK_THAT(result.out, Contains("fc1.weight  F32    [20, 10]    800  model.safetensors\n"));
  CHECK_THAT(result.out, Contains("fc1.bias    F32    [20]         80  model.safetensors\n"));
  CHECK_THAT(result.out, Contains("fc2.weight") && Contains("fc2.bias"));
  CHECK_THAT(result.out, Contains("4 tensors, 1 shard, 1.68 KiB (1720 bytes)\nvalid\n"));
}

TEST_CASE("inspect: a sharded checkpoint shows each tensor's shard", "[cli][inspect]") {
  auto dir = weightcast::test::corpus_dir() / "sharded" / "ok_sharded";
  auto result = weightcast::test::run_cli({"inspect", dir.string()});
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  CHECK(result.exit_status == 0);
  CHECK_THAT(result.out, Contains("model.layers.2.w2  BF16   [16, 10]    320  "
                                  "model-00003-of-00003.safetensors\n"));
  CHECK_THAT(result.out, Contains("9 tensors, 3 shards,") && Contains("\nvalid\n"));
}

TEST_CASE("inspect: a malformed file exits 65 with the loader's message", "[cli][inspect]") {
  auto file = weightcast::test::corpus_dir() / "malformed" / "bad_offsets_reversed.safetensors";
  auto result = weightcast::test::run_cli({"inspect", file.string()});
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  CHECK(result.exit_status == 65);
  CHECK(result.out.empty());
  CHECK(result.err == "weightcast: error: " + file.string() +
                          ": tensor 'w.b': data_offsets [64, 48] end before begin\n");
}

TEST_CASE("inspect: a Git LFS pointer exits 65 saying so", "[cli][inspect]") {
  auto dir = weightcast::test::corpus_dir() / "real-negative" /
             "jeremieconte__granite-3.1-1b-a400m-instruct";
  auto result = weightcast::test::run_cli({"inspect", dir.string()});
  INFO("stderr:\n" << result.err);
  CHECK(result.exit_status == 65);
  CHECK_THAT(result.err, Contains("Git LFS pointer") && Contains("git lfs pull"));
}

TEST_CASE("inspect: a missing path exits 66", "[cli][inspect]") {
  weightcast::test::TempDir dir;
  auto missing = (dir / "no-such-checkpoint").string();
  auto result = weightcast::test::run_cli({"inspect", missing});
  INFO("stderr:\n" << result.err);
  CHECK(result.exit_status == 66);
  CHECK_THAT(result.err, Contains(missing) && Contains("no such file"));
}

TEST_CASE("inspect: columns line up by display width with UTF-8 names", "[cli][inspect]") {
  // "ä" is one column in two bytes; each CJK character is two columns in three bytes.
  weightcast::test::TempDir dir;
  const auto file = dir / "utf8.safetensors";
  weightcast::test::write_file(
      file, weightcast::test::make_safetensors(
                R"({"abcdefgh":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                R"("重みの名前":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},)"
                R"("ä":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
                weightcast::test::zeros(3)));
  auto result = weightcast::test::run_cli({"inspect", file.string()});
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  REQUIRE(result.exit_status == 0);
  // The name column is as wide as the widest name, 10 columns: every DTYPE starts at column 12.
  CHECK_THAT(result.out, StartsWith("NAME        DTYPE  SHAPE  BYTES  SHARD\n"
                                    "abcdefgh    U8     [1]        1  utf8.safetensors\n"
                                    "重みの名前  U8     [1]        1  utf8.safetensors\n"
                                    "ä           U8     [1]        1  utf8.safetensors\n"));
}

TEST_CASE("inspect: columns line up by terminal width with emoji, combining marks and zero-width "
          "characters",
          "[cli][inspect]") {
  // "🚀" (U+1F680) is two columns in four bytes, which fmt's width estimate counts as one;
  // "é" written e + U+0301 is one column in three bytes and two code points; U+200B is none.
  weightcast::test::TempDir dir;
  const auto file = dir / "wide.safetensors";
  weightcast::test::write_file(
      file, weightcast::test::make_safetensors(
                R"({"abcdefgh":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                R"("🚀🚀🚀":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},)"
                "\"cafe\xcc\x81\xe2\x80\x8b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
                weightcast::test::zeros(3)));
  auto result = weightcast::test::run_cli({"inspect", file.string()});
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  REQUIRE(result.exit_status == 0);
  CHECK_THAT(result.out, StartsWith("NAME      DTYPE  SHAPE  BYTES  SHARD\n"
                                    "abcdefgh  U8     [1]        1  wide.safetensors\n"
                                    "🚀🚀🚀    U8     [1]        1  wide.safetensors\n"
                                    "cafe\xcc\x81\xe2\x80\x8b      U8     [1]        1  wide.safetensors\n"));
}

TEST_CASE("inspect: shows __metadata__, and counts agree in number", "[cli][inspect]") {
  weightcast::test::TempDir dir;
  const auto file = dir / "meta.safetensors";
  const std::string long_value(300, 'v');
  weightcast::test::write_file(
      file, weightcast::test::make_safetensors(
                R"({"__metadata__":{"format":"pt","重み":"ß","long":")" + long_value +
                    R"("},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                weightcast::test::zeros(1)));
  auto result = weightcast::test::run_cli({"inspect", file.string()});
  INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
  REQUIRE(result.exit_status == 0);
  CHECK_THAT(result.out, Contains("__metadata__ (3 keys):\n"
                                  "  format  pt\n"
                                  "  long    " + std::string(200, 'v') + "… (300 bytes)\n"
                                  "  重み    ß\n"));
  CHECK_THAT(result.out, Contains("\n1 tensor, 1 shard, 1 B (1 byte)\nvalid\n"));
}

TEST_CASE("inspect and run: a directory of PyTorch .bin files says so", "[cli][inspect]") {
  weightcast::test::TempDir dir;
  weightcast::test::write_file(dir / "config.json", "{}");
  weightcast::test::write_file(dir / "pytorch_model-00001-of-00002.bin", "PK\x03\x04");
  weightcast::test::write_file(dir / "pytorch_model-00002-of-00002.bin", "PK\x03\x04");
  weightcast::test::write_file(dir / "pytorch_model.bin.index.json", "{}");
  for (const char* command : {"inspect", "run"}) {
    INFO(command);
    auto result =
        std::string(command) == "inspect"
            ? weightcast::test::run_cli({"inspect", dir.path().string()})
            : weightcast::test::run_cli({"run", "--quiet", "--set", "device=host", "--set",
                                         "checkpoint=" + dir.path().string()});
    INFO("stdout:\n" << result.out << "\nstderr:\n" << result.err);
    CHECK(result.exit_status == 66);
    CHECK_THAT(result.err,
               StartsWith("weightcast: error: " + dir.path().string() +
                          ": holds no *.safetensors.index.json index and no *.safetensors file, "
                          "only PyTorch weights (pytorch_model-00001-of-00002.bin, "
                          "pytorch_model-00002-of-00002.bin, pytorch_model.bin.index.json), "
                          "which weightcast does not read: convert") &&
                   Contains("safe_serialization=True"));
  }
}

TEST_CASE("inspect and run: a directory with no safetensors file or index exits 66 saying so",
          "[cli][inspect]") {
  // Not "does not exist": the directory exists, it just holds no checkpoint.
  weightcast::test::TempDir dir;
  weightcast::test::write_file(dir / "config.json", "{}");
  const std::string expected = "weightcast: error: " + dir.path().string() +
                               ": holds no *.safetensors.index.json index and no *.safetensors "
                               "file\n";
  auto inspect = weightcast::test::run_cli({"inspect", dir.path().string()});
  INFO("inspect stdout:\n" << inspect.out << "\nstderr:\n" << inspect.err);
  CHECK(inspect.exit_status == 66);
  CHECK(inspect.out.empty());
  CHECK(inspect.err == expected);
  auto run = weightcast::test::run_cli(
      {"run", "--quiet", "--set", "device=host", "--set", "checkpoint=" + dir.path().string()});
  INFO("run stdout:\n" << run.out << "\nstderr:\n" << run.err);
  CHECK(run.exit_status == 66);
  CHECK(run.err == expected);
}
