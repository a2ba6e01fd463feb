/*
 * Running the nsa command straight from a build tree (./build/tools/nsa): the
 * backend modules sit in build/backends/<name>/, which the library's loader
 * does not search. When the executable is the one meson built here and
 * NSA_BACKEND_PATH is unset, point it at those folders. An installed nsa lives
 * elsewhere and is left alone (the loader finds modules in <libdir>/nsa).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tool.h"

#ifndef NSA_BUILD_TOOL_DIR
#define NSA_BUILD_TOOL_DIR ""
#endif
#ifndef NSA_BUILD_BACKEND_PATH
#define NSA_BUILD_BACKEND_PATH ""
#endif

void tool_use_build_tree_modules(void)
{
    const char *env = getenv("NSA_BACKEND_PATH");
    if ((env && *env) || !*NSA_BUILD_TOOL_DIR || !*NSA_BUILD_BACKEND_PATH) return;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash) return;
    *slash = '\0';
    char built[PATH_MAX];
    if (!realpath(NSA_BUILD_TOOL_DIR, built) || strcmp(self, built) != 0) return;
    setenv("NSA_BACKEND_PATH", NSA_BUILD_BACKEND_PATH, 0);
}
