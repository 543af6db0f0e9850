# What a program needs of the dynamic loader, for the two bundles that carry Lockstep's programs to
# machines without its Debian libraries (sourced, never run):
#
#   scripts/gpu-bundle.sh     the GPU machine's test archive: programs and the libraries they
#                             link, on that machine's own glibc, CUDA and (preferably) GCC runtime
#   scripts/bundle/agent.sh   the exec agent for a user's own image (docs/exec.md): the agent, every
#                             library it links, glibc and its own loader, so that nothing of the
#                             image it lands in is loaded into it
#
# Both resolve libraries the same way (resolved_libraries) and sort them into the same classes;
# what each does with a class differs, and is said where it does it.

# Library classes, by the name a program needs the library by.
is_glibc() {  # the C library's own parts: they must match the loader that runs them
  case $1 in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*.so.* | \
      libresolv.so.* | libutil.so.* | libanl.so.* | libmvec.so.* | linux-vdso.so.*) return 0 ;;
  esac
  return 1
}
is_cuda() {  # must match a GPU machine's driver: taken from that machine, never bundled
  case $1 in
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | \
      libnvidia-*) return 0 ;;
  esac
  return 1
}
is_gcc_runtime() {
  case $1 in
    libstdc++.so.* | libgcc_s.so.*) return 0 ;;
  esac
  return 1
}

# "name path" for each library the loader resolves for $1 on this machine ("name not-found" when
# it does not); the loader's own line and the vDSO are left out.
resolved_libraries() {
  ldd "$1" | awk '$2 == "=>" { print $1, ($3 == "not" ? "not-found" : $3) }'
}

# The path of the dynamic loader (PT_INTERP) that ELF program $1 names.
program_interpreter() {
  readelf -l "$1" | sed -n 's/.*program interpreter: \(.*\)]$/\1/p'
}

# The newest GLIBC_2.x symbol version that the ELF files $@ need, as "2.x".
newest_glibc_version_needed() {
  local file
  for file in "$@"; do
    readelf -V -W "$file" 2>/dev/null | sed -n '/Version needs/,$p' |
      grep -oE 'GLIBC_2\.[0-9]+' || true
  done | sed 's/^GLIBC_//' | sort -uV | tail -n 1
}
