// The placement keys: `placement: replicate|fsdp` and the `placement_rules` list, from a file
// and from --set, strict as the rest of the config (errors name file:line and the rule), and
// printed back in a form that loads to the same rules.
#include "weightcast/config/config.hpp"
#include "weightcast/core/error.hpp"

#include "support/expect_error.hpp"
#include "support/paths.hpp"
#include "support/safetensors_writer.hpp"

#include <catch2/catch.hpp>

using namespace weightcast;
using Catch::Matchers::Contains;
using weightcast::test::expect_error;

namespace {

Config from_yaml(const test::TempDir& dir, const std::string& yaml) {
  const auto path = dir / "c.yaml";
  test::write_file(path, yaml);
  return load_config(path.string(), {});
}

}  // namespace

TEST_CASE("placement keys: mode and rules from a file and from --set - printed back",
          "[placement][config]") {
  test::TempDir dir;
  const Config c = from_yaml(dir, R"(placement: fsdp
placement_rules:
  - {match: "*.o_proj.weight", shard: {dim: 1}}
  - match: "*.down_proj.weight"
    shard: {dim: 1, group: 2}
  - {match: "q.*", shard: {dim: 0, ranks: [1, 2]}}
  - {match: "stage.*", ranks: [2]}
  - {match: "rope*", skip: true}
  - {match: "lm_head.weight", replicate: true}
)");
  REQUIRE(c.placement.mode == PlacementMode::fsdp);
  REQUIRE(c.placement.rules.size() == 6);
  REQUIRE(c.placement.rules[0].action == PlacementRule::Action::shard);
  REQUIRE(c.placement.rules[0].dim == 1);
  REQUIRE(c.placement.rules[1].group == 2);
  REQUIRE(c.placement.rules[2].ranks == std::vector<int>{1, 2});
  REQUIRE(c.placement.rules[3].action == PlacementRule::Action::ranks);
  REQUIRE(c.placement.rules[4].action == PlacementRule::Action::skip);
  REQUIRE(c.placement.rules[5].action == PlacementRule::Action::replicate);
  // The effective config loads back to the same placement.
  const Config back = from_yaml(dir, c.to_yaml());
  REQUIRE(back.placement.mode == PlacementMode::fsdp);
  REQUIRE(back.placement.rules.size() == 6);
  REQUIRE(back.placement.rules[2].ranks == c.placement.rules[2].ranks);
  REQUIRE(back.placement.rules[1].group == 2);
  REQUIRE(back.placement.rules[0].pattern == "*.o_proj.weight");
  REQUIRE(back.to_yaml() == c.to_yaml());
  // --set.
  const Config s = load_config("", {"placement=fsdp",
                                    "placement_rules=[{match: w, shard: {dim: 1}}]"});
  REQUIRE(s.placement.mode == PlacementMode::fsdp);
  REQUIRE(s.placement.rules.size() == 1);
  REQUIRE(load_config("", {}).placement.replicates_all());
  REQUIRE_THAT(load_config("", {}).to_yaml(), Contains("placement: replicate\nplacement_rules: []\n"));
}

TEST_CASE("placement keys: bad values name the file - the line and the rule", "[placement][config]") {
  test::TempDir dir;
  auto refused = [&](const std::string& yaml, std::vector<std::string> parts) {
    const Error e = expect_error([&] { from_yaml(dir, yaml); });
    REQUIRE(e.code() == Errc::config);
    for (const auto& p : parts) REQUIRE_THAT(e.what(), Contains(p));
  };
  refused("placement: fsdp2\n", {"c.yaml:1", "placement", "replicate, fsdp"});
  refused("placement_rules: fsdp\n", {"c.yaml:1", "placement_rules", "list of rules"});
  refused("placement_rules:\n  - {shard: {dim: 1}}\n", {"c.yaml:2", "rule 1", "needs match"});
  refused("placement_rules:\n  - {match: a, skip: true}\n  - {match: b}\n",
          {"c.yaml:3", "rule 2", "exactly one of"});
  refused("placement_rules:\n  - {match: a, skip: true, ranks: [1]}\n", {"rule 1", "(has 2)"});
  refused("placement_rules:\n  - {match: a, shard: {dim: -1}}\n", {"c.yaml:2", "shard.dim"});
  refused("placement_rules:\n  - {match: a, shard: {dims: 1}}\n", {"unknown key 'dims'"});
  refused("placement_rules:\n  - {match: a, shard: {group: 2}}\n", {"needs dim"});
  refused("placement_rules:\n  - {match: a, ranks: 2}\n", {"ranks", "list of ranks"});
  refused("placement_rules:\n  - {match: a, skip: false}\n", {"skip: true"});
  refused("placement_rules:\n  - {match: a, shard: {dim: 1}, dtype: F32}\n",
          {"unknown key 'dtype'"});
  refused("placement_rules: []\nplacement_rules: []\n", {"given twice"});
  const Error e = expect_error([] { load_config("", {"placement_rules=[{match: a"}); });
  REQUIRE_THAT(e.what(), Contains("--set placement_rules"));
}
