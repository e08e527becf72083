/* keygen: `downpour keygen FILE` — a CURVE key pair for a server or a worker
 * (FILE secret, mode 0600; FILE.pub public), one line of Z85 each. */
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "deploy/launcher/commands.h"
#include "proto/curve.h"

static void s_usage(FILE *f)
{
    fprintf(f, "usage: downpour keygen FILE\n"
               "Writes a CURVE key pair: FILE (the secret key, mode 0600) and FILE.pub (the\n"
               "public key), one line of Z85 text each. Give FILE to the process that owns it\n"
               "(--curve-secret) and FILE.pub to its peers (--curve-allow, --curve-server).\n");
}

int dp_keygen_main(int argc, char **argv)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        s_usage(stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "downpour keygen: expected one FILE argument\n");
        s_usage(stderr);
        return 2;
    }
    char err[DP_ERR_LEN];
    if (dp_curve_keygen(argv[1], err) != 0) {
        fprintf(stderr, "downpour keygen: %s\n", err);
        return 1;
    }
    printf("wrote %s (secret key, mode 0600) and %s.pub (public key)\n", argv[1], argv[1]);
    return 0;
}
