def _cq_env(marker):
    import sys, os, json
    want = ('numpy', 'pandas', 'matplotlib', 'scipy')
    pk = {}
    for name in want:
        v = getattr(sys.modules.get(name), '__version__', None)
        if isinstance(v, str):
            pk[name] = v
    try:
        cwd = os.path.realpath(os.getcwd())
    except OSError:
        cwd = None
    for d in sys.path if len(pk) < len(want) else ():
        try:
            if not d or os.path.realpath(d) == cwd:
                continue
            names = os.listdir(d)
        except (OSError, TypeError, ValueError):
            continue
        for n in names:
            for ext in ('.dist-info', '.egg-info'):
                if n.endswith(ext):
                    base, _, ver = n[:-len(ext)].partition('-')
                    ver = ver.split('-')[0]
                    if base in want and base not in pk and ver and \
                            os.path.isdir(os.path.join(d, n)):
                        pk[base] = ver
    env = {'python': '%d.%d.%d' % tuple(sys.version_info[:3]),
           'packages': pk}
    sys.stdout.write('\n' + marker + json.dumps(env) + '\n')
    sys.stdout.flush()
