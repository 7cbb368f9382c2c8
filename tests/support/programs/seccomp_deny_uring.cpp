// Test helper: runs a command where io_uring is refused, as under Docker's default seccomp
// profile (io_uring_setup fails with EPERM).
//
//   seccomp_deny_uring [--deny-o-direct] [--deny-o-tmpfile] [--deny-uring-submit=ERRNO]
//                      PROGRAM [ARG]...
//
// --deny-o-direct also makes open/openat with O_DIRECT fail with EINVAL, which is what a
// filesystem that refuses O_DIRECT answers (tmpfs before Linux 6.6, some FUSE and overlay
// setups): it lets a test reach that path on any filesystem.
// --deny-o-tmpfile makes open/openat with O_TMPFILE fail with EOPNOTSUPP, as on a file
// system without unnamed files (NFS).
// --deny-uring-submit=ERRNO (EPERM or EAGAIN) lets io_uring be set up but makes every
// io_uring_enter that submits (to_submit > 0) fail with ERRNO, while one that only waits for
// completions still works: io_uring_submit fails as it would when the kernel refuses the
// reads (EAGAIN: it is short of memory), and nothing the test sees was ever sent.
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

// @return the errno --deny-uring-submit=NAME names, or 0 for a name not known here.
int errno_named(const char* name) {
  if (std::strcmp(name, "EPERM") == 0) return EPERM;
  if (std::strcmp(name, "EAGAIN") == 0) return EAGAIN;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int first = 1;
  bool deny_o_direct = false;
  bool deny_o_tmpfile = false;
  int deny_submit = 0;  // errno for a submitting io_uring_enter; 0: io_uring is refused whole
  constexpr const char* submit_option = "--deny-uring-submit=";
  for (; first < argc; ++first) {
    if (std::strcmp(argv[first], "--deny-o-direct") == 0) {
      deny_o_direct = true;
    } else if (std::strcmp(argv[first], "--deny-o-tmpfile") == 0) {
      deny_o_tmpfile = true;
    } else if (std::strncmp(argv[first], submit_option, std::strlen(submit_option)) == 0) {
      deny_submit = errno_named(argv[first] + std::strlen(submit_option));
      if (deny_submit == 0) {
        std::fprintf(stderr, "%s: ERRNO must be EPERM or EAGAIN\n", argv[first]);
        return 64;
      }
    } else {
      break;
    }
  }
  if (first >= argc) {
    std::fprintf(stderr,
                 "usage: %s [--deny-o-direct] [--deny-o-tmpfile] [--deny-uring-submit=ERRNO] "
                 "PROGRAM [ARG]...\n",
                 argv[0]);
    return 64;
  }
  scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
  if (filter == nullptr) {
    std::fprintf(stderr, "seccomp_init failed\n");
    return 70;
  }
  int rc = 0;
  if (deny_submit != 0) {
    const scmp_arg_cmp submits = SCMP_A1(SCMP_CMP_NE, 0);  // io_uring_enter's to_submit
    rc = deny(filter, SCMP_SYS(io_uring_enter), deny_submit, 1, &submits);
  } else {
    rc = deny(filter, SCMP_SYS(io_uring_setup), EPERM, 0, nullptr);
  }
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
