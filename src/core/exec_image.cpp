#include "weightcast/core/detail/exec_image.hpp"

#include <unistd.h>
#include <string_view>

extern char** environ;

namespace weightcast::detail {

ExecImage::ExecImage(const std::vector<std::string>& argv, const std::vector<std::string>& env)
    : _argv_strings(argv) {
  for (char** e = environ; *e != nullptr; ++e) _env_strings.emplace_back(*e);
  for (const auto& kv : env) {
    // "KEY=": the entries for KEY; an entry without '=' is KEY itself.
    const auto key = kv.substr(0, kv.find('=')) + '=';
    std::erase_if(_env_strings, [&](const std::string& s) {
      return s.rfind(key, 0) == 0 || s == std::string_view(key).substr(0, key.size() - 1);
    });
    _env_strings.push_back(kv);
  }
  for (auto& a : _argv_strings) _argv.push_back(a.data());
  _argv.push_back(nullptr);
  for (auto& s : _env_strings) _envp.push_back(s.data());
  _envp.push_back(nullptr);
}

}  // namespace weightcast::detail
