/* What a CUDA program does first: load libcuda by name through the image's own
 * loader and ask it for the CUDA version. Prints, for libcuda.so.1 and then
 * libcuda.so, "DLOPEN <name> <path the loader chose> <cuDriverGetVersion>" or
 * "DLOPEN <name> FAILED <reason>"; exits 1 if either fails. Built with the
 * host's C compiler by tests/images.py; the test images hold only it, glibc and
 * (Debian-family ones) a shell and ldconfig. Each name is loaded into a link-map
 * namespace of its own, so the second lookup is not answered by the first. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>

int main(void) {
    const char *names[] = {"libcuda.so.1", "libcuda.so"};
    int failed = 0;
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *lib = dlmopen(LM_ID_NEWLM, names[i], RTLD_NOW | RTLD_LOCAL);
        if (lib == NULL) {
            printf("DLOPEN %s FAILED %s\n", names[i], dlerror());
            failed = 1;
            continue;
        }
        struct link_map *map = NULL;
        int (*version)(int *) = (int (*)(int *))dlsym(lib, "cuDriverGetVersion");
        int v = -1;
        if (version != NULL)
            version(&v);
        dlinfo(lib, RTLD_DI_LINKMAP, &map);
        printf("DLOPEN %s %s %d\n", names[i], map ? map->l_name : "?", v);
    }
    fflush(stdout);
    return failed;
}
