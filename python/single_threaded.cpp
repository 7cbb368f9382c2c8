// Only in the self-contained build (WEIGHTCAST_SELF_CONTAINED, python/CMakeLists.txt).
//
// Debian's libyaml-cpp.a is not position-independent: its objects reach glibc's
// `__libc_single_threaded` (which libstdc++'s shared_ptr reads to skip atomics while a process
// has one thread) with a PC-relative relocation that a shared object cannot resolve against
// libc.so ("recompile with -fPIC"). This module-local definition satisfies those references
// inside the module. It says "not single-threaded", always: every reference-count update in
// the module is then atomic, which is what the flag allows to skip, never what it requires, so
// the behaviour is correct whatever the process's threads; the cost is an atomic increment
// where a plain one would do. Hidden: nothing outside the module sees it, and the process's own
// flag (glibc's, which torch's libstdc++ reads) is untouched.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
