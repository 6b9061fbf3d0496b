# kpool_preload.py - the warm-up that imports the kernel server's modules
# in a pooled kernel (kpool.c's preload_code(), which appends the call
# with their names and deletes the name); a module that fails to import
# is skipped.


def _cq_preload(names):
    import importlib
    for m in names:
        try:
            importlib.import_module(m)
        except Exception:
            pass
