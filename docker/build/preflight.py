"""Fail fast, in one line, when a package index of this build cannot be reached from inside it.

pip retries an unreachable index five times per package and, where it is only an extra index, goes on with the
others: minutes of silence, then a different build than asked for. This asks every index once, first.

    python preflight.py PIP_CONF TORCH_PIP_CONF
"""

import base64
import configparser
import re
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT_S = 20


def redact(url: str) -> str:
    """An index URL without the credentials a mirror URL may carry."""
    return re.sub(r"//[^/@]+@", "//***@", url)


def indexes(path: str) -> tuple[list[str], str | None]:
    """The http(s) indexes of a pip.conf and its CA bundle."""
    config = configparser.ConfigParser()
    config.read(path)
    section = config["global"] if config.has_section("global") else {}
    urls = [section.get("index-url", "https://pypi.org/simple")]
    urls += section.get("extra-index-url", "").split()
    return [u for u in urls if u.startswith(("http://", "https://"))], section.get("cert")


def reach(url: str, cert: str | None) -> str | None:
    """None when the index answers (any HTTP status), else why not."""
    context = ssl.create_default_context(cafile=cert) if cert else None
    parts = urllib.parse.urlsplit(url.rstrip("/") + "/pip/")
    request = urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])))
    if parts.username:  # a mirror's credentials go in a header, as pip sends them
        token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except ssl.SSLError as exc:
        return f"TLS: {exc.reason or exc}"
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, ssl.SSLError):
            return f"TLS: {reason.reason or reason}"
        return str(reason)
    except (TimeoutError, OSError) as exc:
        return str(exc) or type(exc).__name__
    return None


def main(pip_conf: str, torch_conf: str) -> int:
    general, cert = indexes(pip_conf)
    torch_only = [u for u in indexes(torch_conf)[0] if u not in general]
    for url in torch_only + general:
        why = reach(url, cert)
        if why is None:
            continue
        if "TLS" in why or "CERTIFICATE" in why.upper():
            fix = "behind a TLS-intercepting proxy pass --ca-bundle FILE (its CA bundle)"
        elif url in torch_only:
            fix = "pass --torch-index-url URL of a torch index this network reaches, or --wheelhouse DIR holding the torch wheel"
        else:
            fix = "pass --pip-index-url URL of a mirror this network reaches, or --wheelhouse DIR"
        print(f"verl-deploy: cannot reach the package index {redact(url)} from inside the build ({why}): {fix}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
