// A directory of tensor pieces (torch DCP's HuggingFaceStorageWriter(save_distributed=True)):
// refused by default, read piece by piece with CheckpointPieces::separate, its faults named.
#include "weightcast/checkpoint/checkpoint.hpp"
#include "weightcast/core/error.hpp"

#include "support/paths.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace {

using namespace weightcast;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using nlohmann::json;

/// One stored piece: a tensor's name, its shape and its saved offsets (none: no entry in
/// DCP_SHARDING_INFO).
struct Piece {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint64_t> offset;
  std::string dtype = "F32";
};

/// Writes a file of F32 (or @p dtype) pieces, each filled with bytes (k * 16 + i) so that a
/// wrong offset changes what is read, as torch's writer does: DCP_SHARDING_INFO as a JSON
/// string of {name: {"saved_offsets": [...]}} (unless @p sharding_info is given verbatim).
void write_pieces(const fs::path& path, const std::vector<Piece>& pieces,
                  std::optional<std::string> sharding_info = std::nullopt) {
  json header = json::object();
  json info = json::object();
  std::string data;
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const Piece& piece = pieces[k];
    std::uint64_t elements = 1;
    for (auto extent : piece.shape) elements *= extent;
    const std::uint64_t bytes = elements * (piece.dtype == "F32" ? 4 : 1);
    header[piece.name] = {{"dtype", piece.dtype},
                          {"shape", piece.shape},
                          {"data_offsets", {data.size(), data.size() + bytes}}};
    if (!piece.offset.empty() || piece.shape.empty()) {
      info[piece.name] = {{"saved_offsets", piece.offset}};
    }
    for (std::uint64_t i = 0; i < bytes; ++i) data += static_cast<char>(k * 16 + i);
  }
  header["__metadata__"] = {{"DCP_SHARDING_INFO", sharding_info.value_or(info.dump())},
                            {"DCP_VERSION", "1.0"},
                            {"format", "pt"}};
  test::write_file(path, test::make_safetensors(header.dump(), data));
}

Error open_failure(const fs::path& path, CheckpointPieces pieces, Errc code) {
  try {
    open_checkpoint(path, pieces);
  } catch (const Error& e) {
    INFO("message: " << e.what());
    CHECK(e.code() == code);
    return e;
  }
  FAIL("checkpoint " << path.string() << " was accepted but should be refused");
  return Error(Errc::internal, "unreachable");
}

}  // namespace

TEST_CASE("pieces: two ranks' files of one model read as pieces, each placed in its tensor",
          "[checkpoint][pieces]") {
  test::TempDir dir;
  // Rank 1 holds rows 2-3 of w and all of the norm (replicated tensors are saved once).
  write_pieces(dir / "shard-00001-model-00001-of-00001.safetensors",
               {{"w", {2, 3}, {0, 0}}, {"s", {}, {}}});
  write_pieces(dir / "shard-00002-model-00001-of-00001.safetensors",
               {{"w", {2, 3}, {2, 0}}, {"norm", {3}, {0}}});

  SECTION("refused by default, named as DCP's pieces with the reader that loads them") {
    const Error e = open_failure(dir.path(), CheckpointPieces::refuse, Errc::missing_input);
    CHECK_THAT(e.what(), Contains("HuggingFaceStorageWriter(save_distributed=True)") &&
                             Contains("weightcast.dcp.HuggingFaceStorageReader") &&
                             Contains("shard-00001-model-00001-of-00001.safetensors"));
  }
  SECTION("separate: an entry per piece, named by its place when the tensor is split") {
    const Catalogue catalogue = open_checkpoint(dir.path(), CheckpointPieces::separate);
    REQUIRE(catalogue.tensors.size() == 4);
    REQUIRE(catalogue.pieces.size() == 4);
    std::vector<std::string> names;
    for (const auto& t : catalogue.tensors) names.push_back(t.name);
    CHECK(names == std::vector<std::string>{"w [piece at 0, 0]", "s", "w [piece at 2, 0]",
                                            "norm"});
    CHECK(catalogue.pieces[0].tensor == "w");
    CHECK(catalogue.pieces[2].offset == std::vector<std::uint64_t>{2, 0});
    CHECK(catalogue.pieces[2].global == std::vector<std::uint64_t>{4, 3});
    CHECK(catalogue.pieces[1].global.empty());  // a scalar
    CHECK(catalogue.pieces[3].global == std::vector<std::uint64_t>{3});
    // Each piece's bytes are its own file's.
    CHECK(catalogue.tensors[2].shard == 1);
    CHECK(catalogue.shards[catalogue.tensors[2].shard].name ==
          "shard-00002-model-00001-of-00001.safetensors");
    CHECK(catalogue.tensors[2].shape == std::vector<std::uint64_t>{2, 3});
    CHECK(catalogue.tensors[2].bytes == 24);
  }
  SECTION("a file of whole tensors opens alone as before, placed whole with pieces") {
    write_pieces(dir / "whole.safetensors", {{"w", {4, 3}, {0, 0}}});
    const Catalogue catalogue =
        open_checkpoint(dir / "whole.safetensors", CheckpointPieces::separate);
    REQUIRE(catalogue.pieces.size() == 1);
    CHECK(catalogue.tensors[0].name == "w");
    CHECK(catalogue.pieces[0].global == std::vector<std::uint64_t>{4, 3});
    CHECK(open_checkpoint(dir / "whole.safetensors").pieces.empty());
  }
}

TEST_CASE("pieces: a file without DCP_SHARDING_INFO holds whole tensors", "[checkpoint][pieces]") {
  test::TempDir dir;
  write_pieces(dir / "a.safetensors", {{"w", {2}, {0}}, {"w2", {2}, {2}}});
  test::write_file(dir / "b.safetensors",
                   test::make_safetensors(R"({"v":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                                          "xy"));
  SECTION("whole tensors beside pieces") {
    const Error e = open_failure(dir.path(), CheckpointPieces::separate, Errc::invalid_checkpoint);
    // w2 lies at [2, 4) of a tensor whose first two elements no file holds.
    CHECK_THAT(e.what(), Contains("'w2'") && Contains("hold 2 of the 4 elements") &&
                             Contains("in no file"));
  }
}

TEST_CASE("pieces: each fault names the file, the tensor and the pieces", "[checkpoint][pieces]") {
  test::TempDir dir;
  const fs::path a = dir / "a.safetensors";
  const fs::path b = dir / "b.safetensors";
  struct Case {
    const char* what;
    std::vector<Piece> in_a;
    std::vector<Piece> in_b;
    std::optional<std::string> info_a;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"overlap", {{"w", {3, 2}, {0, 0}}}, {{"w", {2, 2}, {2, 0}}}, {},
       {"'w'", "the piece at [0, 0] in 'a.safetensors'", "the piece at [2, 0] in 'b.safetensors'",
        "overlap"}},
      {"the same tensor whole in two files", {{"w", {2}, {0}}}, {{"w", {2}, {0}}}, {},
       {"'w'", "overlap"}},
      {"a hole between pieces", {{"w", {1, 2}, {0, 0}}}, {{"w", {1, 2}, {2, 0}}}, {},
       {"'w'", "hold 4 of the 6 elements of the shape [3, 2]"}},
      {"pieces of two dtypes", {{"w", {2}, {0}}}, {{"w", {2}, {2}, "U8"}}, {},
       {"'w'", "is F32", "U8"}},
      {"pieces of two ranks", {{"w", {2}, {0}}}, {{"w", {2, 1}, {2, 0}}}, {},
       {"'w'", "has 1 dims", "2"}},
      {"offsets of the wrong rank", {{"w", {2}, {0}}}, {{"v", {2}, {0}}},
       R"({"w": {"saved_offsets": [0, 0]}})",
       {"a.safetensors", "'w'", "2 saved_offsets for 1 dims"}},
      {"a negative offset", {{"w", {2}, {0}}}, {{"v", {2}, {0}}},
       R"({"w": {"saved_offsets": [-2]}})", {"a.safetensors", "not all non-negative integers"}},
      {"no entry for a tensor", {{"w", {2}, {0}}}, {{"v", {2}, {0}}}, R"({"x": {"saved_offsets": [0]}})",
       {"a.safetensors", "'w'", "has no entry for this tensor"}},
      {"not JSON", {{"w", {2}, {0}}}, {{"v", {2}, {0}}}, "{oops", {"a.safetensors", "not a JSON object"}},
      {"a piece named as another tensor's piece",
       {{"w", {1}, {0}}, {"w [piece at 1]", {1}, {0}}},
       {{"w", {1}, {1}}}, {},
       {"'w [piece at 1]' names both a tensor stored whole and a piece of tensor 'w'"}},
      {"an extent past torch's int64 sizes", {{"w", {0}, {0}}, {"v", {2}, {0}}},
       {{"w", {0}, {9223372036854775808ull}}}, {}, {"'w'", "over 2^63 - 1"}},
  };
  for (const auto& c : cases) {
    SECTION(c.what) {
      write_pieces(a, c.in_a, c.info_a);
      write_pieces(b, c.in_b);
      const Error e = open_failure(dir.path(), CheckpointPieces::separate, Errc::invalid_checkpoint);
      for (const auto& part : c.message) CHECK_THAT(e.what(), Contains(part));
    }
  }
}

TEST_CASE("pieces: empty pieces are dropped, a scalar and an empty tensor stay",
          "[checkpoint][pieces]") {
  test::TempDir dir;
  // torch.chunk gives trailing ranks no rows: their piece has a 0 extent, and may share its
  // offset with another rank's (empty or not).
  write_pieces(dir / "a.safetensors",
               {{"w", {3, 4}, {0, 0}}, {"s", {}, {}}, {"e", {0, 4}, {0, 0}}});
  write_pieces(dir / "b.safetensors",
               {{"w", {2, 4}, {3, 0}}, {"e", {0, 4}, {0, 0}}, {"z", {0, 4}, {5, 0}}});
  write_pieces(dir / "c.safetensors", {{"w", {0, 4}, {5, 0}}, {"z", {5, 4}, {0, 0}}});
  write_pieces(dir / "d.safetensors", {{"w", {0, 4}, {0, 0}}});
  const Catalogue catalogue = open_checkpoint(dir.path(), CheckpointPieces::separate);
  std::vector<std::string> names;
  for (const auto& t : catalogue.tensors) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"w [piece at 0, 0]", "s", "e", "w [piece at 3, 0]", "z"});
  REQUIRE(catalogue.pieces.size() == 5);
  CHECK(catalogue.pieces[3].global == std::vector<std::uint64_t>{5, 4});
  CHECK(catalogue.pieces[2].global == std::vector<std::uint64_t>{0, 4});  // every piece empty
  CHECK(catalogue.pieces[4].offset == std::vector<std::uint64_t>{0, 0});  // whole after the drop
}

TEST_CASE("pieces: one rank's file alone is a hole, not a whole tensor", "[checkpoint][pieces]") {
  test::TempDir dir;
  const fs::path file = dir / "shard-00002-model-00001-of-00001.safetensors";
  write_pieces(file, {{"w", {2, 4}, {3, 0}}});
  for (const fs::path& path : {dir.path(), file}) {
    const Error e = open_failure(path, CheckpointPieces::separate, Errc::invalid_checkpoint);
    CHECK_THAT(e.what(), Contains("'w'") && Contains("hold 8 of the 20 elements"));
  }
  // As a safetensors file it is valid, and the reference reads it so: [2, 4] named w.
  const Catalogue plain = open_checkpoint(dir.path());
  CHECK(plain.tensors.at(0).shape == std::vector<std::uint64_t>{2, 4});
  CHECK(plain.pieces.empty());
}

TEST_CASE("pieces: DCP_SHARDING_INFO read as torch's reader reads it", "[checkpoint][pieces]") {
  test::TempDir dir;
  SECTION("-0 is an offset of 0, an empty value places nothing") {
    write_pieces(dir / "a.safetensors", {{"w", {2}, {0}}}, R"({"w": {"saved_offsets": [-0]}})");
    write_pieces(dir / "b.safetensors", {{"v", {2}, {0}}}, "");
    const Catalogue catalogue = open_checkpoint(dir.path(), CheckpointPieces::separate);
    REQUIRE(catalogue.tensors.size() == 2);
    CHECK(catalogue.tensors[0].name == "w");
    CHECK(catalogue.tensors[1].name == "v");
  }
  SECTION("load's refusal names the reader when any file holds pieces, not only the first") {
    test::write_file(dir / "a.safetensors",
                     test::make_safetensors(R"({"v":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                                            "xy"));
    write_pieces(dir / "b.safetensors", {{"w", {2}, {0}}});
    const Error e = open_failure(dir.path(), CheckpointPieces::refuse, Errc::missing_input);
    CHECK_THAT(e.what(), Contains("weightcast.dcp.HuggingFaceStorageReader"));
  }
}
