# sandbox_probe.py - run by sandbox.c's probe() under bubblewrap as a
# kernel would be: exits 0 when the file bubblewrap made on the sandbox's
# /tmp (argv[1]) holds what the probe wrote into it (argv[2]).
import sys

sys.exit(open(sys.argv[1]).read() != sys.argv[2])
