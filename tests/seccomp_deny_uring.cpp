// Test helper: runs a command where io_uring is refused, as under Docker's default seccomp
// profile (io_uring_setup fails with EPERM).
//
//   seccomp_deny_uring [--deny-o-direct] [--deny-o-tmpfile] PROGRAM [ARG]...
//
// --deny-o-direct also makes open/openat with O_DIRECT fail with EINVAL, which is what a
// filesystem that refuses O_DIRECT answers (tmpfs before Linux 6.6, some FUSE and overlay
// setups): it lets a test reach that path on any filesystem.
// --deny-o-tmpfile makes open/openat with O_TMPFILE fail with EOPNOTSUPP, as on a file
// system without unnamed files (NFS).
#include <seccomp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

namespace {

int deny(scmp_filter_ctx filter, int syscall, int err, unsigned arg_count,
         const scmp_arg_cmp* args) {
  return seccomp_rule_add_array(filter, SCMP_ACT_ERRNO(err), syscall, arg_count, args);
}

}  // namespace

int main(int argc, char** argv) {
  int first = 1;
  bool deny_o_direct = false;
  bool deny_o_tmpfile = false;
  for (; first < argc; ++first) {
    if (std::strcmp(argv[first], "--deny-o-direct") == 0) {
      deny_o_direct = true;
    } else if (std::strcmp(argv[first], "--deny-o-tmpfile") == 0) {
      deny_o_tmpfile = true;
    } else {
      break;
    }
  }
  if (first >= argc) {
    std::fprintf(stderr, "usage: %s [--deny-o-direct] [--deny-o-tmpfile] PROGRAM [ARG]...\n",
                 argv[0]);
    return 64;
  }
  scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
  if (filter == nullptr) {
    std::fprintf(stderr, "seccomp_init failed\n");
    return 70;
  }
  int rc = deny(filter, SCMP_SYS(io_uring_setup), EPERM, 0, nullptr);
  if (rc == 0 && deny_o_direct) {
    const scmp_arg_cmp open_flags = SCMP_A1(SCMP_CMP_MASKED_EQ, O_DIRECT, O_DIRECT);
    const scmp_arg_cmp openat_flags = SCMP_A2(SCMP_CMP_MASKED_EQ, O_DIRECT, O_DIRECT);
    rc = deny(filter, SCMP_SYS(open), EINVAL, 1, &open_flags);
    if (rc == 0) rc = deny(filter, SCMP_SYS(openat), EINVAL, 1, &openat_flags);
  }
  if (rc == 0 && deny_o_tmpfile) {
    const scmp_arg_cmp open_flags = SCMP_A1(SCMP_CMP_MASKED_EQ, O_TMPFILE, O_TMPFILE);
    const scmp_arg_cmp openat_flags = SCMP_A2(SCMP_CMP_MASKED_EQ, O_TMPFILE, O_TMPFILE);
    rc = deny(filter, SCMP_SYS(open), EOPNOTSUPP, 1, &open_flags);
    if (rc == 0) rc = deny(filter, SCMP_SYS(openat), EOPNOTSUPP, 1, &openat_flags);
  }
  // An unprivileged process may install a filter only with no_new_privs set.
  if (rc == 0) rc = seccomp_attr_set(filter, SCMP_FLTATR_CTL_NNP, 1);
  if (rc == 0) rc = seccomp_load(filter);
  seccomp_release(filter);
  if (rc != 0) {
    std::fprintf(stderr, "installing the seccomp filter failed: %s\n", std::strerror(-rc));
    return 70;
  }
  execvp(argv[first], argv + first);
  std::fprintf(stderr, "%s: %s\n", argv[first], std::strerror(errno));
  return 127;
}
