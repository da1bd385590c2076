"""Renders `.krew.yaml` (krew-release-bot's template) into a krew plugin manifest for one archive:
`{{ .TagName }}` becomes the tag, `{{addURIAndSha "URI" .TagName }}` the archive's `uri:` and `sha256:`.

    krew_manifest.py TEMPLATE TAG ARCHIVE > netcm.yaml
"""

import hashlib
import re
import sys

ADD_URI_AND_SHA = re.compile(r'\{\{\s*addURIAndSha\s+"([^"]+)"\s+\.TagName\s*\}\}')
TAG = re.compile(r"\{\{\s*\.TagName\s*\}\}")


def render(template, tag, sha256):
    """The manifest for release `tag` whose archive's SHA-256 is `sha256`."""

    def uri_and_sha(m):
        indent = template[: m.start()].rsplit("\n", 1)[-1]
        uri = TAG.sub(tag, m.group(1))
        return f"uri: {uri}\n{indent}sha256: {sha256}"

    out = ADD_URI_AND_SHA.sub(uri_and_sha, template)
    out = TAG.sub(tag, out)
    if "{{" in out:
        raise SystemExit("krew_manifest: a template action is left unrendered")
    return out


def main(argv):
    template, tag, archive = argv
    with open(archive, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    with open(template) as fh:
        sys.stdout.write(render(fh.read(), tag, sha))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
