// `placement_rules`: reading the list of rules by tensor name from YAML, and printing it back.
#include "weightcast/config/detail/config_parts.hpp"

#include "weightcast/core/error.hpp"

#include <fmt/core.h>

#include <charconv>

namespace weightcast::detail {

std::vector<PlacementRule> parse_placement_rules(const YAML::Node& node,
                                                 const std::string& file,
                                                 const std::string& set_where) {
  auto at = [&](const YAML::Node& n) {
    return file.empty() ? fmt::format("--set {}: ", rules_key)
                        : fmt::format("{}:{}: {}: ", file, n.Mark().line + 1, rules_key);
  };
  // The whole value's place, as every key's messages say it.
  const std::string where = file.empty() ? set_where : at(node);
  if (node.IsNull()) throw Error(Errc::config, where + "has no value");
  if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    if (const auto nul = text.find('\0'); nul != std::string::npos) {
      throw Error(Errc::config, fmt::format("{}{} holds a NUL byte at byte {}: no setting can "
                                            "hold one, and a path would end there",
                                            where, quote_value(text), nul));
    }
    if (trim(text).empty()) throw Error(Errc::config, where + "has no value");
  }
  if (!node.IsSequence()) {
    throw Error(Errc::config, fmt::format("{}expects a list of rules, got {}", at(node),
                                          node_kind(node)));
  }
  auto integer = [&](const YAML::Node& n, std::string_view what, long long lo, long long hi) {
    long long value = 0;
    const std::string text = n.IsScalar() ? n.Scalar() : std::string();
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (!n.IsScalar() || ec != std::errc() || end != text.data() + text.size() || value < lo ||
        value > hi) {
      throw Error(Errc::config, fmt::format("{}{}: {} is not an integer from {} to {}", at(n),
                                            what, n.IsScalar() ? quote_value(text)
                                                               : std::string(node_kind(n)),
                                            lo, hi));
    }
    return value;
  };
  auto rank_list = [&](const YAML::Node& n, std::string_view what) {
    if (!n.IsSequence()) {
      throw Error(Errc::config, fmt::format("{}{}: expects a list of ranks, got {}", at(n),
                                            what, node_kind(n)));
    }
    std::vector<int> ranks;
    for (const auto& r : n) ranks.push_back(static_cast<int>(integer(r, what, 0, 1 << 24)));
    return ranks;
  };
  auto yes = [&](const YAML::Node& n, std::string_view what) {
    if (!n.IsScalar() || (n.Scalar() != "true" && n.Scalar() != "True" && n.Scalar() != "yes")) {
      throw Error(Errc::config, fmt::format("{}{}: write `{}: true`", at(n), what, what));
    }
  };
  std::vector<PlacementRule> rules;
  for (std::size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& item = node[i];
    const std::string name = fmt::format("rule {}", i + 1);
    if (!item.IsMap()) {
      throw Error(Errc::config, fmt::format("{}{}: expects a mapping (match: GLOB and an "
                                            "action), got {}",
                                            at(item), name, node_kind(item)));
    }
    PlacementRule rule;
    int actions = 0;
    bool matched = false;
    for (const auto& entry : item) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string();
      const YAML::Node& value = entry.second;
      if (key == "match") {
        if (!value.IsScalar() || value.Scalar().empty()) {
          throw Error(Errc::config, fmt::format("{}{}: match: expects a glob of tensor names",
                                                at(value), name));
        }
        rule.pattern = value.Scalar();
        matched = true;
      } else if (key == "replicate" || key == "skip") {
        yes(value, key);
        rule.action = key == "skip" ? PlacementRule::Action::skip
                                    : PlacementRule::Action::replicate;
        ++actions;
      } else if (key == "ranks") {
        rule.action = PlacementRule::Action::ranks;
        rule.ranks = rank_list(value, "ranks");
        ++actions;
      } else if (key == "shard") {
        rule.action = PlacementRule::Action::shard;
        ++actions;
        if (!value.IsMap()) {
          throw Error(Errc::config, fmt::format("{}{}: shard: expects {{dim: D}} (and "
                                                "optionally ranks: [...] or group: G), got {}",
                                                at(value), name, node_kind(value)));
        }
        bool dim = false;
        for (const auto& s : value) {
          const std::string k = s.first.IsScalar() ? s.first.Scalar() : std::string();
          if (k == "dim") {
            rule.dim = static_cast<std::uint32_t>(integer(s.second, "shard.dim", 0, 63));
            dim = true;
          } else if (k == "ranks") {
            rule.ranks = rank_list(s.second, "shard.ranks");
          } else if (k == "group") {
            rule.group = static_cast<std::uint32_t>(integer(s.second, "shard.group", 1, 1 << 24));
          } else {
            throw Error(Errc::config, fmt::format("{}{}: shard: unknown key {} (known: dim, "
                                                  "ranks, group)",
                                                  at(s.first), name, quote_value(k)));
          }
        }
        if (!dim) {
          throw Error(Errc::config, fmt::format("{}{}: shard: needs dim", at(value), name));
        }
      } else {
        throw Error(Errc::config, fmt::format("{}{}: unknown key {} (known: match, shard, "
                                              "replicate, skip, ranks)",
                                              at(entry.first), name, quote_value(key)));
      }
    }
    if (!matched) throw Error(Errc::config, fmt::format("{}{}: needs match: GLOB", at(item), name));
    if (actions != 1) {
      throw Error(Errc::config, fmt::format("{}{}: needs exactly one of shard, replicate, skip, "
                                            "ranks (has {})",
                                            at(item), name, actions));
    }
    rules.push_back(std::move(rule));
  }
  return rules;
}

std::string print_placement_rules(const std::vector<PlacementRule>& rules) {
  YAML::Emitter out;
  out << YAML::Flow << YAML::BeginSeq;
  for (const PlacementRule& rule : rules) {
    out << YAML::BeginMap << YAML::Key << "match" << YAML::Value << YAML::DoubleQuoted
        << rule.pattern;
    switch (rule.action) {
      case PlacementRule::Action::replicate:
        out << YAML::Key << "replicate" << YAML::Value << "true";
        break;
      case PlacementRule::Action::skip:
        out << YAML::Key << "skip" << YAML::Value << "true";
        break;
      case PlacementRule::Action::ranks:
        out << YAML::Key << "ranks" << YAML::Value << YAML::Flow << rule.ranks;
        break;
      case PlacementRule::Action::shard:
        out << YAML::Key << "shard" << YAML::Value << YAML::BeginMap << YAML::Key << "dim"
            << YAML::Value << rule.dim;
        if (!rule.ranks.empty()) out << YAML::Key << "ranks" << YAML::Value << YAML::Flow << rule.ranks;
        if (rule.group > 1) out << YAML::Key << "group" << YAML::Value << rule.group;
        out << YAML::EndMap;
        break;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  return out.c_str();
}

}  // namespace weightcast::detail
