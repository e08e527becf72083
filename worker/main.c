/* downpour-worker (placeholder until the executor lands). */
#include <stdio.h>
int main(void) { fprintf(stderr, "downpour-worker: not built yet\n"); return 2; }
