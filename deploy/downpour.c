/* downpour: the launcher (placeholder until it lands). */
#include <stdio.h>
int main(void) { fprintf(stderr, "downpour: not built yet\n"); return 2; }
