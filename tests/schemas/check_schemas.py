#!/usr/bin/python3
# check_schemas.py - validate real coderq messages against schemas/ with
# Debian's python3-jsonschema (Draft 2020-12), for the test suites:
#
#   check_schemas.py jobs MANIFEST
#       MANIFEST: JSON lines {"name", "b64"} (a job message's bytes).
#       Prints one line per case: NAME<TAB>valid|invalid<TAB>why. A
#       message is read as coderq reads it (UTF-8, no duplicate keys, no
#       NaN or Infinity, integers within 64 bits, no lone surrogates);
#       one that does not read is invalid before the schema is asked.
#   check_schemas.py events RESULTS PROGRESS
#       RESULTS, PROGRESS: JSON lines of completion and progress events
#       captured from a worker. Each must be valid, and every field it has
#       must be one the schema declares (so a field added to the events
#       without the schema is caught). Exit 1 with the reasons otherwise.
#   check_schemas.py schemas
#       Check the schema files themselves against the metaschema.
import base64
import json
import math
import os
import sys

try:
    import jsonschema
except ImportError:
    sys.exit("python3-jsonschema is missing: run scripts/setup.sh")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMAS = os.path.join(ROOT, "schemas")
NAMES = ("job", "completion-event", "progress-event")


def validator(name):
    with open(os.path.join(SCHEMAS, name + ".schema.json"), encoding="utf-8") as fp:
        schema = json.load(fp)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def load_like_coderq(data):
    """Parse bytes the way jansson does for coderq, or raise ValueError."""
    text = data.decode("utf-8")

    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate key")
        return dict(items)

    def constant(name):
        raise ValueError("not JSON: " + name)

    def integer(s):
        v = int(s)
        if not -(2**63) <= v < 2**63:
            raise ValueError("integer out of 64 bits")
        return v

    def real(s):
        v = float(s)
        if math.isinf(v):
            raise ValueError("real number overflow")
        return v

    doc = json.loads(text, object_pairs_hook=pairs, parse_constant=constant,
                     parse_int=integer, parse_float=real)

    def walk(v):
        if isinstance(v, str):
            v.encode("utf-8")  # a lone surrogate raises
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)

    walk(doc)
    return doc


def one_line(s):
    return " ".join(str(s).split())[:300]


def check_jobs(manifest):
    job = validator("job")
    with open(manifest, encoding="utf-8") as fp:
        for line in fp:
            case = json.loads(line)
            data = base64.b64decode(case["b64"])
            try:
                doc = load_like_coderq(data)
            except (ValueError, RecursionError, UnicodeError) as e:
                print(f"{case['name']}\tinvalid\tnot JSON as coderq reads it: {one_line(e)}")
                continue
            errors = sorted(job.iter_errors(doc), key=lambda e: list(e.absolute_path))
            if errors:
                path = "/".join(str(p) for p in errors[0].absolute_path)
                print(f"{case['name']}\tinvalid\t{path}: {one_line(errors[0].message)}")
            else:
                print(f"{case['name']}\tvalid\t")
    return 0


def declared(schema, doc):
    """Every property name the schema declares for doc: at its top level,
    in the then (or else) of each allOf condition doc meets (or does not),
    and in every branch of a oneOf or anyOf there."""
    names = set(schema.get("properties", {}))
    for key in ("oneOf", "anyOf"):
        for sub in schema.get(key, []):
            names |= declared(sub, doc)
    for sub in schema.get("allOf", []):
        if "if" in sub:
            met = jsonschema.Draft202012Validator(sub["if"]).is_valid(doc)
            branch = sub.get("then" if met else "else")
            if branch:
                names |= declared(branch, doc)
        else:
            names |= declared(sub, doc)
    return names


def check_events(results, progress):
    failures = []
    seen_types = set()
    for path, name in ((results, "completion-event"), (progress, "progress-event")):
        v = validator(name)
        n = 0
        with open(path, encoding="utf-8") as fp:
            for i, line in enumerate(fp, 1):
                if not line.strip():
                    continue
                n += 1
                doc = load_like_coderq(line.encode("utf-8"))
                for e in v.iter_errors(doc):
                    failures.append(f"{path} line {i}: {'/'.join(map(str, e.absolute_path))}: {one_line(e.message)}")
                extra = sorted(set(doc) - declared(v.schema, doc))
                if extra:
                    failures.append(f"{path} line {i}: fields the schema does not declare: {', '.join(extra)}")
                if name == "progress-event":
                    seen_types.add(doc.get("type"))
        if n == 0:
            failures.append(f"{path}: no events")
        print(f"{name}: {n} events checked")
    print("progress types seen: " + ", ".join(sorted(t for t in seen_types if t)))
    for f in failures:
        print(f)
    return 1 if failures else 0


def main(argv):
    if len(argv) == 3 and argv[1] == "jobs":
        return check_jobs(argv[2])
    if len(argv) == 4 and argv[1] == "events":
        return check_events(argv[2], argv[3])
    if len(argv) == 2 and argv[1] == "schemas":
        for n in NAMES:
            validator(n)
            print(f"{n}.schema.json: a valid Draft 2020-12 schema")
        return 0
    sys.stderr.write("usage: check_schemas.py jobs MANIFEST | events RESULTS PROGRESS | schemas\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
