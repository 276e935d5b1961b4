"""Every error a logcompact user can see. Each message is one line that names the thing and the fix."""


class LogcompactError(Exception):
    """Base class of every error logcompact raises on purpose."""


class InvalidStoreUriError(LogcompactError):
    """A store URI is neither file:///path nor s3://bucket/prefix."""


class ObjectNotFoundError(LogcompactError):
    """An object the caller expected in the store is not there."""


class StoreError(LogcompactError):
    """The object store answered a request with an error."""


class CorruptDataError(LogcompactError):
    """A data file is not what its checks or the catalog's record of it say: a failed CRC-32, a truncated or
    replaced file, a section whose rows differ from the catalog's record, an unknown format version. The
    message names the file, the section when known, and what was expected and found."""

    key: str | None = None  # the damaged file, set by the reader that met it (a compaction sets its partition aside)


class InvalidTopicError(LogcompactError):
    """A topic name, partition count or topic config is not allowed."""


class TopicNotFoundError(LogcompactError):
    """A command names a topic the catalog does not have."""


class TransactionNotFoundError(LogcompactError):
    """A command names a transactional id the catalog does not have, or asks to abort one with no open transaction."""


class TopicExistsError(LogcompactError):
    """A topic is created twice."""


class InvalidRecordError(LogcompactError):
    """A produced record breaks a rule of its topic (no key in a compacted topic, bad partition, bad field)."""


class ClusterNotFoundError(LogcompactError):
    """The store holds no logcompact catalog."""


class CatalogConfigError(LogcompactError):
    """No catalog database is given where one is needed, or its URL is not one logcompact can use."""


class CatalogUnavailableError(LogcompactError):
    """The catalog database cannot be reached or refuses the connection: a retry may succeed."""


class TransactionRolledBackError(CatalogUnavailableError):
    """The catalog database rolled a write transaction back for a concurrent one (a deadlock victim, a serialization
    failure): nothing was written, and running it again may succeed. A CatalogUnavailableError for those who answer
    one (a Kafka client is told to retry), though the database is up."""


class ClusterMismatchError(LogcompactError):
    """The object store and the catalog database belong to different clusters, or a store without a marker holds
    data the catalog does not account for."""


class StaleCatalogError(LogcompactError):
    """The catalog is older than its store has seen: it was restored from an older copy."""


class CatalogSchemaError(LogcompactError):
    """The catalog database holds another schema version than this logcompact's."""


class ManifestVersionNotFoundError(LogcompactError):
    """A reader asked for a manifest version that was never written or is no longer kept."""


class CommitConflictError(LogcompactError):
    """An optimistic commit found the catalog changed in a way that invalidates it."""


class PlansNotCommittedError(LogcompactError):
    """Plans of one commit failed for different causes (a conflict, a changed document, damaged data, the store or
    the catalog failing): the call's other plans committed, and the message lists each failure."""


class InvalidPlanError(LogcompactError):
    """A compaction plan is malformed, inconsistent, or belongs to another cluster."""


class IngestError(LogcompactError):
    """The ingest agent failed to write or commit an L0 file; records buffered with it were not committed."""


class VerificationError(LogcompactError):
    """Data read back differs from what a check expected (the demo's and the benchmarks' own checks)."""
