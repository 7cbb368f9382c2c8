/**
 * @file exec_image.hpp
 * @brief A child's argv and environment, built before `fork` so that the child only execs.
 *
 * Internal (no Asio). After `fork` in a multithreaded process only async-signal-safe calls
 * are allowed (POSIX `fork`), so nothing may allocate there: `weightcast launch` and the
 * tests' process helpers build an ExecImage first and pass `argv()` and `envp()` to
 * `execve`/`execvpe` in the child.
 */
#pragma once

#include <string>
#include <vector>

namespace weightcast::detail {

/// @p argv, and this process's environment with each of @p env ("KEY=VALUE"; "KEY" alone
/// counts as the key too) replacing any entry for KEY, as the NULL-terminated arrays `execve`
/// takes. Allocates (build it before `fork`); throws nothing but `std::bad_alloc`. Copying or
/// moving it would leave the pointers aimed at the source's strings, so it is neither.
class ExecImage {
 public:
  ExecImage(const std::vector<std::string>& argv, const std::vector<std::string>& env);
  ExecImage(const ExecImage&) = delete;
  ExecImage& operator=(const ExecImage&) = delete;

  /// @return argv for execve: argv[0] first, NULL last. Valid while this object lives.
  [[nodiscard]] char* const* argv() const noexcept { return _argv.data(); }
  /// @return envp for execve, NULL last. Valid while this object lives.
  [[nodiscard]] char* const* envp() const noexcept { return _envp.data(); }

 private:
  std::vector<std::string> _argv_strings;
  std::vector<std::string> _env_strings;
  std::vector<char*> _argv;
  std::vector<char*> _envp;
};

}  // namespace weightcast::detail
