#!/usr/bin/env bash
# Installs a built tree into a staging folder (DESTDIR) and builds
# examples/forward.c against the installed library three ways -- pkg-config,
# CMake (find_package(nsa)), meson (dependency('nsa')) -- and runs each on the
# cpu backend; checks that the installed nsa tool starts (its RUNPATH) and finds
# the installed modules, that the man page, LICENSE and CMake files are there,
# and that the README's "API in short" is examples/forward.c verbatim.
#   bash .ci/consumers.sh BUILD_DIR
set -uo pipefail
build=$1
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$root/$build/stage
work=$root/$build/consumers
rm -rf "$stage" "$work"
mkdir -p "$work"
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

if ! DESTDIR="$stage" meson install -C "$build" --no-rebuild > "$work/install.log" 2>&1; then
  tail -20 "$work/install.log"
  bad "meson install"
  exit 1
fi
ok "meson install (DESTDIR=$stage)"
read -r prefix libdir bindir mandir datadir < <(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(o["prefix"], o["libdir"], o["bindir"], o["mandir"], o["datadir"])')
p=$stage$prefix
lib=$p/$libdir
export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
for f in "$p/include/nsa.h" "$lib/pkgconfig/nsa.pc" "$lib/pkgconfig/libnsa.pc" "$lib/cmake/nsa/nsaConfig.cmake" \
         "$lib/cmake/nsa/nsaConfigVersion.cmake" "$p/$mandir/man1/nsa.1" "$p/$datadir/doc/libnsa/LICENSE"; do
  [ -f "$f" ] && ok "installed ${f#$p/}" || bad "installed ${f#$p/}"
done
ls "$lib"/libnsa.so.0 > /dev/null 2>&1 && ok "libnsa.so.0 (soname)" || bad "libnsa.so.0 (soname)"

# the installed tool, with no LD_LIBRARY_PATH: RUNPATH finds libnsa, libnsa finds the modules beside it
if env -u LD_LIBRARY_PATH -u NSA_BACKEND_PATH "$p/$bindir/nsa" info > "$work/info.log" 2>&1; then
  ok "installed nsa info starts"
  for m in "$lib"/nsa/libnsa_backend_*.so; do
    [ -e "$m" ] || continue
    name=$(basename "$m" .so); name=${name#libnsa_backend_}
    # found and loaded: "available", or unavailable for a reason other than a missing module
    if grep -Eq "^  $name " "$work/info.log" && ! grep -Eq "^  $name +unavailable \(module " "$work/info.log"; then
      ok "installed nsa info finds module $name: $(grep -E "^  $name " "$work/info.log" | sed 's/^ *//')"
    else
      bad "installed nsa info finds module $name"; cat "$work/info.log"
    fi
  done
else
  bad "installed nsa info starts"; cat "$work/info.log"
fi

# pkg-config
if cc -std=c11 "$root/examples/forward.c" $(pkg-config --cflags --libs nsa) -o "$work/forward_pc" 2> "$work/pc.log" &&
   LD_LIBRARY_PATH=$lib NSA_BACKEND=cpu "$work/forward_pc" > "$work/pc.out" 2>&1; then
  ok "pkg-config build runs: $(cat "$work/pc.out")"
else
  bad "pkg-config build"; cat "$work/pc.log" "$work/pc.out" 2>/dev/null
fi
# CMake (RPATH to the imported location)
if command -v cmake > /dev/null; then
  if cmake -S "$root/examples/consumer" -B "$work/cmake" -DCMAKE_PREFIX_PATH="$p" > "$work/cmake.log" 2>&1 &&
     cmake --build "$work/cmake" >> "$work/cmake.log" 2>&1 && NSA_BACKEND=cpu "$work/cmake/forward" > "$work/cmake.out" 2>&1; then
    ok "CMake find_package(nsa) build runs: $(cat "$work/cmake.out")"
  else
    bad "CMake build"; tail -20 "$work/cmake.log"; cat "$work/cmake.out" 2>/dev/null
  fi
else
  bad "cmake is not installed"
fi
# meson, through nsa.pc
mkdir -p "$work/meson-src" && cp "$root/examples/consumer/meson.build" "$root/examples/forward.c" "$work/meson-src/"
if meson setup "$work/meson-build" "$work/meson-src" > "$work/meson.log" 2>&1 && ninja -C "$work/meson-build" >> "$work/meson.log" 2>&1 &&
   LD_LIBRARY_PATH=$lib NSA_BACKEND=cpu "$work/meson-build/forward" > "$work/meson.out" 2>&1; then
  ok "meson dependency('nsa') build runs: $(cat "$work/meson.out")"
else
  bad "meson build"; tail -20 "$work/meson.log"; cat "$work/meson.out" 2>/dev/null
fi

# the README's snippet is examples/forward.c, verbatim
if python3 - "$root/README.md" "$root/examples/forward.c" <<'PY'
import sys
readme, src = open(sys.argv[1]).read(), open(sys.argv[2]).read()
mark = "<!-- examples/forward.c -->\n```c\n"
i = readme.find(mark)
if i < 0:
    sys.exit("README has no examples/forward.c block")
j = readme.find("```\n", i + len(mark))
sys.exit(0 if readme[i + len(mark):j] == src else "README's block differs from examples/forward.c")
PY
then ok "README's API in short is examples/forward.c"; else bad "README's API in short is examples/forward.c"; fi

echo "consumers: $fails failure(s)"
[ $fails -eq 0 ]
