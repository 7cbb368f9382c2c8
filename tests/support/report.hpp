// JSON files in tests: reading a `--report`, a trace or a manifest, running `weightcast run`
// with a report, and checking a report's tensors against the corpus manifest.
#pragma once

#include "support/process.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace weightcast::test {

/// Parses the JSON file @p path (a report, a trace, a manifest). REQUIREs that the file
/// opens; anything but valid JSON throws nlohmann::json::parse_error, failing the test.
nlohmann::json read_json(const std::filesystem::path& path);

/// @return the real corpus's manifest, corpus_dir()/real/MANIFEST.json: for each file (its
///         path relative to corpus_dir()/real), each tensor's "xxh3", "dtype" and "shape".
nlohmann::json corpus_manifest();

/// Runs `weightcast run` on the real corpus file @p file (relative to corpus_dir()/real) with
/// chunk_size=4KiB (many chunks even for small files), the extra `--set` items @p sets
/// ("key=value") and `--report @p report_path`. REQUIREs exit status 0, showing the output
/// when it is not.
/// @return the run's exit status and output; read the report with read_json(@p report_path).
ProcessResult run_corpus_file(const std::string& file, const std::filesystem::path& report_path,
                              const std::vector<std::string>& sets = {});

/// REQUIREs that @p report (what `--report` wrote) holds as many tensors as @p expected (one
/// file's entry in the manifest) and each of them, and CHECKs each tensor's "xxh3", "dtype"
/// and "shape" against the manifest's.
void check_report_matches_manifest(const nlohmann::json& report, const nlohmann::json& expected);

}  // namespace weightcast::test
