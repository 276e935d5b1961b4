"""TLS on SSL and SASL_SSL listeners: the server's context (Kafka's ssl.* broker settings, PEM files in place of
keystores) and the principal of a client certificate (Kafka's DefaultKafkaPrincipalBuilder: `User:` + the subject DN
in RFC 2253 form as Java's X500Principal.getName gives it, reshaped by ssl.principal.mapping.rules, KIP-371).

The handshake is made by the connection itself (`handshake`), not by asyncio's server: asyncio drops a failed
server-side handshake without a word outside its debug mode, and each failure must leave one log line naming the
peer and the reason.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from cryptography import x509
from cryptography.x509.name import _ASN1Type

from logcompact.exceptions import LogcompactError
from logcompact.kafka.session import ANONYMOUS, KafkaPrincipal
from logcompact.limits import DEFAULT_SSL_HANDSHAKE_TIMEOUT_MS, DEFAULT_SSL_PRINCIPAL_MAPPING_RULES, SSL_KEY_PASSWORD_ENV

log = logging.getLogger(__name__)



class ClientAuth(StrEnum):
    """Kafka's ssl.client.auth: whether the agent asks clients for a certificate, and whether it must get one."""

    REQUIRED = "required"
    REQUESTED = "requested"
    NONE = "none"


@dataclass(frozen=True)
class TlsSettings:
    certfile: Path | None = None  # PEM: the agent's certificate, then the chain to its CA (Kafka's ssl.keystore.location)
    keyfile: Path | None = None  # PEM: its private key, encrypted or not
    keyfile_password: str | None = field(default=None, repr=False)  # from SSL_KEY_PASSWORD_ENV; never shown
    cafile: Path | None = None  # PEM: the CAs client certificates must chain to (Kafka's ssl.truststore.location)
    client_auth: ClientAuth = ClientAuth.NONE
    handshake_timeout_ms: int = DEFAULT_SSL_HANDSHAKE_TIMEOUT_MS
    principal_mapping_rules: str = DEFAULT_SSL_PRINCIPAL_MAPPING_RULES

    @property
    def given(self) -> bool:
        """Whether any TLS setting was given (they are refused without a TLS listener, which would ignore them)."""
        return self != TlsSettings(keyfile_password=self.keyfile_password)

    def check(self, tls_listener: str | None) -> None:
        """ValueError naming the option and the fix: a TLS listener (`tls_listener`, its name) needs a certificate
        and key; asking clients for certificates needs the CAs they chain to; TLS settings need a TLS listener; the
        mapping rules must parse."""
        if tls_listener is None:
            if self.given:
                raise ValueError("--ssl-* options are given but no listener uses TLS; add --listen SSL://HOST:PORT (or SASL_SSL://) or drop them")
            return
        if self.certfile is None or self.keyfile is None:
            missing = "--ssl-certfile" if self.certfile is None else "--ssl-keyfile"
            raise ValueError(f"the {tls_listener} listener needs {missing}: pass --ssl-certfile CERT.pem and --ssl-keyfile KEY.pem (PEM files)")
        if self.client_auth is not ClientAuth.NONE and self.cafile is None:
            raise ValueError(f"--ssl-client-auth {self.client_auth} needs --ssl-cafile CA.pem: the CAs client certificates must chain to")
        PrincipalMapper(self.principal_mapping_rules)


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The context of the agent's TLS listeners, TLS 1.2 at least; LogcompactError naming the file and the fix for
    a file that is missing or not what it should be."""
    assert settings.certfile is not None and settings.keyfile is not None, "TlsSettings.check() first"
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    certificate = _pem(settings.certfile, "--ssl-certfile", "CERTIFICATE", "the agent's certificate")
    key = _pem(settings.keyfile, "--ssl-keyfile", "PRIVATE KEY", "the agent's private key")
    if ("ENCRYPTED" in key) and not settings.keyfile_password:
        raise LogcompactError(f"--ssl-keyfile {settings.keyfile}: the key is encrypted; set {SSL_KEY_PASSWORD_ENV} to its password")
    del certificate, key
    try:
        # An empty password rather than none: OpenSSL would prompt on the terminal for an encrypted key.
        context.load_cert_chain(settings.certfile, settings.keyfile, settings.keyfile_password or "")
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            problem = f"--ssl-keyfile {settings.keyfile} is not the key of --ssl-certfile {settings.certfile}; pass the key the certificate was made for"
        elif settings.keyfile_password:
            problem = f"--ssl-keyfile {settings.keyfile} cannot be read with the password in {SSL_KEY_PASSWORD_ENV} ({exc.reason}); set the key's password"
        else:
            problem = f"--ssl-certfile {settings.certfile} or --ssl-keyfile {settings.keyfile} is not a PEM certificate and its key ({exc.reason})"
        raise LogcompactError(problem) from None
    if settings.cafile is not None:
        _pem(settings.cafile, "--ssl-cafile", "CERTIFICATE", "the CA certificates clients' certificates chain to")
        try:
            context.load_verify_locations(cafile=settings.cafile)
        except ssl.SSLError as exc:
            raise LogcompactError(f"--ssl-cafile {settings.cafile} is not PEM CA certificates ({exc.reason}); pass the CAs' certificates in PEM") from None
    context.verify_mode = {ClientAuth.REQUIRED: ssl.CERT_REQUIRED, ClientAuth.REQUESTED: ssl.CERT_OPTIONAL, ClientAuth.NONE: ssl.CERT_NONE}[settings.client_auth]
    return context


def _pem(path: Path, option: str, kind: str, what: str) -> str:
    """The file's text if it holds a PEM block of `kind` (`-----BEGIN ... kind-----`); LogcompactError otherwise."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise LogcompactError(f"{option} {path}: {exc.strerror}; pass the PEM file of {what}") from None
    if not re.search(rf"-----BEGIN [A-Z0-9 ]*{kind}-----", text):
        raise LogcompactError(f"{option} {path} holds no PEM {kind} block; pass the PEM file of {what} (convert a keystore with openssl)")
    return text


async def handshake(writer: asyncio.StreamWriter, context: ssl.SSLContext, timeout_ms: int, peer: str) -> bool:
    """The server side of the TLS handshake on an accepted connection; False, with one log line naming the peer and
    the reason (a plaintext client, an untrusted or expired certificate, a timeout), when it fails."""
    try:
        await writer.start_tls(context, ssl_handshake_timeout=timeout_ms / 1000)
    except ssl.SSLError as exc:
        log.warning("connection from %s closed: TLS handshake failed: %s", peer, ssl_reason(exc))
        return False
    except OSError as exc:  # the client gone, or the handshake timeout (ConnectionAbortedError)
        log.warning("connection from %s closed: TLS handshake failed: %s", peer, exc or type(exc).__name__)
        return False
    return True


def ssl_reason(exc: ssl.SSLError) -> str:
    """What went wrong, in OpenSSL's words (no key material): its reason, and a certificate's verification failure."""
    verify = getattr(exc, "verify_message", None)
    return f"{exc.reason}: {verify}" if verify else str(exc.reason or exc)


def principal_of(ssl_object: ssl.SSLObject | None, mapper: PrincipalMapper) -> KafkaPrincipal:
    """The connection's principal as Kafka's DefaultKafkaPrincipalBuilder makes it for SSL: `User:` + the client
    certificate's subject DN mapped by the rules, User:ANONYMOUS without a certificate. NoMatchingRule when no rule
    maps the DN (Kafka then fails the authentication)."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return ANONYMOUS
    return KafkaPrincipal("User", mapper.name(rfc2253(x509.load_der_x509_certificate(der).subject)))


# -- the subject DN as Java's X500Principal.getName(X500Principal.RFC2253) gives it --------------------------------

_RFC2253_KEYWORDS = {
    x509.NameOID.COMMON_NAME: "CN", x509.NameOID.COUNTRY_NAME: "C", x509.NameOID.LOCALITY_NAME: "L",
    x509.NameOID.STATE_OR_PROVINCE_NAME: "ST", x509.NameOID.ORGANIZATION_NAME: "O", x509.NameOID.ORGANIZATIONAL_UNIT_NAME: "OU",
    x509.NameOID.STREET_ADDRESS: "STREET", x509.NameOID.DOMAIN_COMPONENT: "DC", x509.NameOID.USER_ID: "UID",
}
_ESCAPED = ',=+<>#;"\\'  # Java's AVA escapes these anywhere in a value (RFC 2253 asks fewer; Java's form is the one rules match)
# The value types Java's AVA writes as strings (its isDerString); others are `#` + hex, as unknown attributes.
_JAVA_STRING_TYPES = {
    _ASN1Type.PrintableString, _ASN1Type.T61String, _ASN1Type.IA5String, _ASN1Type.BMPString, _ASN1Type.UTF8String,
}
_CONTENT_ENCODING = {_ASN1Type.BMPString: "utf-16-be", _ASN1Type.UniversalString: "utf-32-be", _ASN1Type.T61String: "latin-1"}


def rfc2253(name: x509.Name) -> str:
    """`name` as Java's X500Principal.getName(RFC2253): RDNs last first, joined by commas, multi-valued ones by
    `+`; the keywords RFC 2253 defines, other attributes as their OID and `#` + the hex of the value's DER."""
    return ",".join("+".join(_attribute(attribute) for attribute in rdn) for rdn in reversed(name.rdns))


def _attribute(attribute: x509.NameAttribute) -> str:
    keyword = _RFC2253_KEYWORDS.get(attribute.oid)
    if keyword is None or attribute._type not in _JAVA_STRING_TYPES:
        return f"{keyword or attribute.oid.dotted_string}=#{_der(attribute).hex()}"
    value = attribute.value if isinstance(attribute.value, str) else attribute.value.decode("latin-1")
    if attribute._type == _ASN1Type.BMPString:  # Java reads a BMPString's UTF-16 bytes as UTF-8 here: "b" is "\00b"
        value = value.encode("utf-16-be").decode("utf-8", errors="replace")
    escaped = "".join("\\00" if c == "\0" else f"\\{c}" if c in _ESCAPED else c for c in value)
    lead = len(escaped) - len(escaped.lstrip(" \r"))
    trail = len(escaped.rstrip(" \r"))  # where trailing whitespace begins
    # Java escapes each leading and trailing space (or carriage return) with a backslash
    return f"{keyword}=" + "".join("\\" + c if i < lead or i >= trail else c for i, c in enumerate(escaped))


def _der(attribute: x509.NameAttribute) -> bytes:
    """The attribute value's DER encoding: its string type's tag, length and content."""
    value = attribute.value
    content = value if isinstance(value, bytes) else value.encode(_CONTENT_ENCODING.get(attribute._type, "utf-8"))
    if attribute._type == _ASN1Type.BitString:
        content = b"\0" + content  # no unused bits
    size = len(content)
    length = bytes([size]) if size < 0x80 else bytes([0x80 | ((size.bit_length() + 7) // 8)]) + size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes([attribute._type.value]) + length + content


# -- ssl.principal.mapping.rules: Kafka's SslPrincipalMapper, ported -----------------------------------------------

# Kafka's RULE_PATTERN, RULE_SPLITTER and RULE_PARSER, character for character.
_RULE_PATTERN = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_RULE_SPLITTER = re.compile(r"\s*(" + _RULE_PATTERN + r")\s*(,\s*|$)")
_RULE_PARSER = re.compile(_RULE_PATTERN)
_BACK_REFERENCE = re.compile(r"\$(\d+)")
_DIGITS = "0123456789"


class NoMatchingRule(LogcompactError):
    """No rule of ssl.principal.mapping.rules maps a DN (Kafka's SslPrincipalMapper.NoMatchingRule)."""


@dataclass(frozen=True)
class MappingRule:
    """One rule: DEFAULT (the DN as it is), or RULE:pattern/replacement/ with L or U to lower or upper the case."""

    pattern: re.Pattern[str] | None = None  # None: DEFAULT
    replacement: str = ""
    to_lower: bool = False
    to_upper: bool = False

    def apply(self, dn: str) -> str | None:
        """The name this rule maps `dn` to, None when its pattern does not match all of it."""
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        groups = self.pattern.groups
        result = self.pattern.sub(lambda match: _java_replacement(_literal_back_references(self.replacement, groups), match), dn)
        if self.to_lower:
            return result.lower()
        if self.to_upper:
            return result.upper()
        return result

    def __str__(self) -> str:  # Kafka's Rule.toString, which its tests compare
        if self.pattern is None:
            return "DEFAULT"
        return f"RULE:{self.pattern.pattern}/{self.replacement}{'/L' if self.to_lower else '/U' if self.to_upper else ''}"


class PrincipalMapper:
    """Kafka's SslPrincipalMapper: the rules of ssl.principal.mapping.rules, comma-separated, the first that matches
    a DN giving the principal's name. ValueError naming the rule for rules that do not parse."""

    def __init__(self, rules: str) -> None:
        self.rules = [rule for text in _split_rules(rules) if (rule := _parse_rule(text)) is not None]

    def name(self, dn: str) -> str:
        for rule in self.rules:
            if (name := rule.apply(dn)) is not None:
                return name
        raise NoMatchingRule(f"no rule of --ssl-principal-mapping-rules maps {dn!r} (rules {self})")

    def __str__(self) -> str:
        return f"[{', '.join(str(rule) for rule in self.rules)}]"


def _split_rules(rules: str) -> list[str]:
    return [match.group(1) for match in _RULE_SPLITTER.finditer(rules.strip())]


def _parse_rule(text: str) -> MappingRule | None:
    """The rule `text` is; None for an empty one (Kafka ignores them); ValueError when it is none."""
    match = _RULE_PARSER.match(text)
    if match is None or match.end() != len(text):
        rest = text if match is None else text[match.end():]
        raise ValueError(f"--ssl-principal-mapping-rules: invalid rule {text!r} (unmatched {rest!r}); a rule is DEFAULT or RULE:pattern/replacement/ with L or U after")
    if match.group(1) is not None:
        return MappingRule()
    if match.group(2) is None:
        return None
    try:
        pattern = re.compile(match.group(2))
    except re.error as exc:
        raise ValueError(f"--ssl-principal-mapping-rules: rule {text!r}: its pattern is not a regular expression: {exc}") from None
    return MappingRule(pattern, match.group(4), match.group(6) == "L", match.group(6) == "U")


def _literal_back_references(replacement: str, groups: int) -> str:
    """Kafka's Rule.escapeLiteralBackReferences (from Apache NiFi): `$N` past the pattern's groups stays literal,
    after trying `$N` less its last digits (`$12` with 1 group is group 1 and a `2`)."""
    if groups == 0:
        return replacement
    value = replacement
    for found in list(_BACK_REFERENCE.finditer(replacement)):
        number = found.group(1)
        if number.startswith("0"):
            continue
        index = int(number)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            # Kafka inserts the backslash at the reference's place in the replacement as given, in the string as
            # rewritten so far (a second insertion lands a character early, as there)
            start = found.start(1) - 1
            value = value[:start] + "\\" + value[start:]
    return value


def _java_replacement(replacement: str, match: re.Match[str]) -> str:
    """`replacement` expanded as Java's Matcher.appendReplacement does: `\\c` is c, `$N` a group (its digits taken
    while they name a group), `${name}` a named group."""
    out: list[str] = []
    position = 0
    while position < len(replacement):
        char = replacement[position]
        if char == "\\":
            position += 1
            if position == len(replacement):
                raise ValueError("character to be escaped is missing")
            out.append(replacement[position])
            position += 1
        elif char == "$":
            position += 1
            if position == len(replacement):
                raise ValueError("Illegal group reference: group index is missing")
            if replacement[position] == "{":
                end = replacement.index("}", position)
                out.append(match.group(replacement[position + 1:end]) or "")
                position = end + 1
                continue
            if replacement[position] not in _DIGITS:
                raise ValueError("Illegal group reference")
            group = int(replacement[position])
            position += 1
            while position < len(replacement) and replacement[position] in _DIGITS:
                longer = group * 10 + int(replacement[position])
                if longer > match.re.groups:
                    break
                group = longer
                position += 1
            if group > match.re.groups:
                raise ValueError(f"No group {group}")
            out.append(match.group(group) or "")
        else:
            out.append(char)
            position += 1
    return "".join(out)
