/* downpour-ps: the parameter-server daemon (placeholder until the server lands). */
#include <stdio.h>
int main(void) { fprintf(stderr, "downpour-ps: not built yet\n"); return 2; }
