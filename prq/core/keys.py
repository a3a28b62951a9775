"""KeySchema: the only place a Redis key or channel name is spelled.

Layout, for prefix `prq` and an endpoint encoded as `<e>`:

    prq:{<e>}:pri            zset    priorities with queued ids (p -> p)    TTL 1 day, refreshed
    prq:{<e>}:pri:s          hash    the share of takes lower priorities    TTL 1 day, refreshed;
                                     get: s (takes since the last lower     deleted when the levels
                                     turn while one waited), c (the level   below the highest run
                                     that turn went to; scripts/_queue.lua) empty
    prq:{<e>}:l:<p>          hash    priority p's clock: g, n (depth), x,   TTL 1 day, refreshed
                                     t, r (scripts/_queue.lua)
    prq:{<e>}:l:<p>:o        zset    priority p's lanes: f (the front lane, TTL 1 day, refreshed
                                     -inf), p<producer> -> virtual time of
                                     that producer's first queued id
    prq:{<e>}:l:<p>:f        list    priority p's front lane (ids given     TTL 1 day, refreshed
                                     back), taken before the producers'
    prq:{<e>}:l:<p>:p<pro>   list    ids producer <pro> queued at p, in     TTL 1 day, refreshed
                                     order (one entry per queued request)
    prq:{<e>}:l:<p>:x        set     ids removed from p's lists but still   TTL 1 day, refreshed
                                     in them (withdraw, cancel; lazy)
    prq:{<e>}:r:<id>         hash    one request: state, body, response     TTL by state
                             (or a string while queued by a batch:
                             the queued form, prq.core.records)
    prq:{<e>}:bh:<token>     string  a batch's shared head: "<pickup        TTL of its requests,
                                     deadline>,<first sequence number>,     renewed by a rerun
                                     <nonce>" (a batch of SHARED_HEAD_MIN
                                     or more; scripts/_body.lua)
    prq:{<e>}:dd:<token>     set     a dedup ledger (prq.bulk.Ledger): the  the ledger's TTL (days),
                                     ids of its requests a receiver took,   renewed by its enqueues
                                     and '.' (it exists); token: 8
                                     characters of the ledger name's hash
    prq:{<e>}:lw:<token>     string  a loss watch (prq.bulk.LossWatch): a   an hour, renewed by
                                     counter its reader steps (canary.lua)  each read
    prq:{<e>}:rs:<id>        string  a request's renewed signature header   TTL its validity
    prq:{<e>}:t:<token>      list    ids handed to one owner token          TTL receipt_ttl_s (52 s)
    prq:{<e>}:parked         list    idle receivers' tokens, oldest first   TTL 1 day, refreshed
    prq:{<e>}:parks          hash    token -> "<node>|<until, server ms>"   TTL 1 day, refreshed
    prq:{<e>}:seq            string  enqueue counter: requests enqueued     TTL 1 day, refreshed
                                     (for operators: prq_endpoint_enqueued)
    prq:{<e>}:sq             string  the last sequence number given: each   TTL 1 day, refreshed
                                     is at least the server's clock in µs
                                     (scripts/_sequence.lua; data loss)
    prq:{<e>}:ts:<node>      string  a receiver's stamp: the server's       TTL 1 day, refreshed
                                     clock (µs) at its last take here
    prq:{<e>}:ss:<node>:<n>  string  a sender's stamp of generation n: the  TTL 1 day, refreshed
                                     clock at its last enqueue carrying it
    prq:{<e>}:run            zset    in-flight ids -> last contact, srv ms  TTL 1 day, refreshed
    prq:{<e>}:alo            zset    the at_least_once ones among them      TTL 1 day, refreshed
    prq:{<e>}:ho             zset    handed ids -> confirm deadline, srv ms TTL 1 day, refreshed
    prq:{<e>}:rcv            zset    receiver node -> last seen, ms         TTL 1 day, refreshed
    prq:{<e>}:dead           zset    dead-lettered ids -> when, ms          TTL 7 days, refreshed
    prq:{<e>}:deadm          hash    id -> dead letter's reason etc (JSON)  TTL 7 days, refreshed
    prq:{<e>}:deadb          hash    id -> the dead request's stored bytes  TTL 7 days, refreshed
    prq:{<e>}:lim            hash    limits: mif (max in flight), mp (max   no TTL: configuration,
                                     pending); absent field = no limit      deleted when cleared
    prq:{<e>}:pulse          channel "work is waiting" for the endpoint's receivers
    prq:loc:{<id>}           string  the endpoint of a request id            TTL of the request
    prq:canary:{<node>}      string  a node's data-loss canary (a counter)   TTL 3 checks + retry
                                                                            budget, refreshed
    prq:canary:{<node>/<n>}  string  on a cluster, its canary on another     the same
                                     master (n: the first number whose key
                                     hashes to a slot that master serves)
    prq:node:<node>          channel responses (and later signals) for one node
    prq:{<e>}:n:<node>       channel on a cluster, the same for the requests of
                                     one endpoint: a shard channel of its
                                     slot (SSUBSCRIBE / SPUBLISH)
    prq:endpoints            zset    encoded endpoint -> last used, ms      TTL 1 day, refreshed

Not written any more: `prq:{<e>}:lv` (zset of priorities) and `prq:{<e>}:q:<p>` (one sorted-set
member per queued id) were the scheduling lanes of the previous layout. A node refuses an
endpoint whose `prq:{<e>}:lv` exists (`EndpointKeys.old_levels`; README, "Upgrading from the
previous layout").

Invariants:
- A level's keys are its clock's name plus `:` and a suffix: `o`, `f`, `x`, or `p` followed by
  the producer (any text: it comes after the hash tag, and the suffixes differ in their first
  character), so no two levels, lanes or producers share a key.
- Every key of one endpoint carries the same hash tag `{<e>}`, so one endpoint's keys share a
  cluster slot and each script touches one slot only.
- `<e>` is an injective encoding of the endpoint: percent-encoding of its UTF-8 bytes with only
  `[A-Za-z0-9_.~-]` left as they are. It never contains `{`, `}`, `:`, glob characters,
  whitespace or control characters, so two different endpoints can never share a key or channel,
  and no user text reaches a key pattern.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

from prq.core.names import readable_endpoint

__all__ = ["EndpointKeys", "KeySchema", "decode_endpoint", "encode_endpoint", "ledger_token"]


def encode_endpoint(endpoint: str) -> str:
    """Encode an endpoint for use inside a key; injective and free of `{}:*?[]`. Any name
    `readable_endpoint` takes is encoded (a name an earlier version took must still reach its
    keys); new work is refused names `validate_endpoint` refuses before it gets here."""
    return quote(readable_endpoint(endpoint), safe="")


def ledger_token(name: str) -> str:
    """The short name of a dedup ledger in keys and records: 8 URL-safe characters (48 bits) of
    the SHA-256 of its name, so a long name costs each record only these."""
    digest = hashlib.sha256(name.encode()).digest()
    return base64.urlsafe_b64encode(digest[:6]).decode()


def decode_endpoint(encoded: str) -> str:
    """Invert `encode_endpoint`."""
    return unquote(encoded, errors="strict")


@dataclass(frozen=True, slots=True)
class EndpointKeys:
    """The keys and channel of one endpoint."""

    endpoint: str
    tag: str
    #: Scripts append a node id to this to reach that node: `<prefix>:node:` on one server; on
    #: a cluster `<tag>:n:`, a shard channel in the endpoint's own slot (SPUBLISH).
    node_channel_prefix: str = ""

    def node_channel(self, node_id: str) -> str:
        """The channel of `node_id` that this endpoint's scripts publish to."""
        return f"{self.node_channel_prefix}{node_id}"

    @property
    def levels(self) -> str:
        """Sorted set of the priorities that hold queued ids (member and score: the priority)."""
        return f"{self.tag}:pri"

    @property
    def share(self) -> str:
        """Hash of the share of takes that goes to lower priorities: `s`, the takes made since the
        last lower turn while a lower level held work, and `c`, the level that turn went to
        (scripts/_queue.lua, which names it `levels` plus `:s`: it survives a level running
        empty)."""
        return f"{self.levels}:s"

    @property
    def old_levels(self) -> str:
        """The previous layout's sorted set of priorities (`prq:{e}:lv`): never written any
        more; read once per endpoint and node to refuse an endpoint that still holds it."""
        return f"{self.tag}:lv"

    @property
    def level_prefix(self) -> str:
        """Prefix of the per-priority keys; scripts append the priority (same hash tag)."""
        return f"{self.tag}:l:"

    def level(self, priority: int | str) -> str:
        """Priority `priority`'s clock (hash: g, n = depth, x, t, r; scripts/_queue.lua); its
        other keys are this name plus a suffix."""
        return f"{self.tag}:l:{priority}"

    def level_lanes(self, priority: int | str) -> str:
        """Sorted set of the level's lanes: `f` (the front lane, score -inf) and `p<producer>`
        scored by the virtual time of that producer's first queued id."""
        return f"{self.tag}:l:{priority}:o"

    def level_lane(self, priority: int | str, member: str) -> str:
        """The list of ids of one lane of `level_lanes` (`member` as in that set)."""
        return f"{self.tag}:l:{priority}:{member}"

    def producer_lane(self, priority: int | str, producer: str) -> str:
        """The ids `producer` queued at `priority`, in order."""
        return self.level_lane(priority, f"p{producer}")

    def front_lane(self, priority: int | str) -> str:
        """Ids given back to the level (redeliveries, hand-offs taken back), taken first."""
        return self.level_lane(priority, "f")

    def level_removed(self, priority: int | str) -> str:
        """Set of ids withdrawn or cancelled while queued that are still in a lane."""
        return f"{self.tag}:l:{priority}:x"

    @property
    def request_prefix(self) -> str:
        """Prefix of request records; scripts append the id (same hash tag, same slot)."""
        return f"{self.tag}:r:"

    def request(self, request_id: str) -> str:
        """A request's record: a hash, or a string in the queued form (prq.core.records)."""
        return f"{self.tag}:r:{request_id}"

    def batch_head(self, token: str) -> str:
        """The shared head `token` of a bulk batch (scripts/_body.lua, enqueue_many.lua)."""
        return f"{self.tag}:bh:{token}"

    def ledger(self, token: str) -> str:
        """A dedup ledger of this endpoint (`ledger_token` of its name; scripts/take.lua)."""
        return f"{self.tag}:dd:{token}"

    def loss_watch(self, token: str) -> str:
        """A reader's loss watch on this endpoint (prq.bulk.LossWatch)."""
        return f"{self.tag}:lw:{token}"

    def renewal(self, request_id: str) -> str:
        """A signed request's renewed signature header (prq.protocol.signing), written by a node
        that holds or replays it."""
        return f"{self.tag}:rs:{request_id}"

    def take_receipt(self, token: str) -> str:
        return f"{self.tag}:t:{token}"

    def stamp(self, node_id: str) -> str:
        """Receiver `node_id`'s stamp: the server's clock at its last take here (scripts/
        take.lua), which tells it at its next take whether Redis went back since."""
        return f"{self.tag}:ts:{node_id}"

    def sent_stamp(self, node_id: str, generation: int) -> str:
        """Sender `node_id`'s stamp here, of one `generation` (scripts/stamp.lua, enqueue.lua):
        the server's clock at its last enqueue carrying it, which tells an enqueue sent again
        whether Redis lost data since. A stamp written afresh (a node's first enqueue here, one
        after a loss it declared or after a long idle time) is of a new generation, so that an
        enqueue still on its way with an older one finds its own as the loss left it."""
        return f"{self.tag}:ss:{node_id}:{generation}"

    @property
    def take_receipt_prefix(self) -> str:
        return f"{self.tag}:t:"

    @property
    def parked(self) -> str:
        return f"{self.tag}:parked"

    @property
    def parks(self) -> str:
        return f"{self.tag}:parks"

    @property
    def sequence(self) -> str:
        """The enqueue counter: how many requests were enqueued (for operators)."""
        return f"{self.tag}:seq"

    @property
    def numbers(self) -> str:
        """The last sequence number the endpoint gave (scripts/_sequence.lua): what nodes
        judge rollbacks and ghosts by (prq.node.data_loss)."""
        return f"{self.tag}:sq"

    @property
    def dead(self) -> tuple[str, str, str]:
        """Dead letters: the zset of ids by time, the hash of their details, the hash of their
        stored bytes."""
        return f"{self.tag}:dead", f"{self.tag}:deadm", f"{self.tag}:deadb"

    @property
    def limits(self) -> str:
        """Hash of the endpoint's capacity limits: `mif` (max in flight), `mp` (max pending)."""
        return f"{self.tag}:lim"

    @property
    def running(self) -> str:
        """Sorted set of taken, unanswered ids, scored by their last contact (server ms)."""
        return f"{self.tag}:run"

    @property
    def lease(self) -> str:
        """Sorted set of the at_least_once ids in flight, scored as in `running`: the ones a
        silent receiver held are handed out again from here (scripts/_redeliver.lua)."""
        return f"{self.tag}:alo"

    @property
    def handoffs(self) -> str:
        """Sorted set of requests handed to parked receivers and not yet confirmed, scored by
        the confirmation deadline (server ms): overdue ones are taken back
        (scripts/_handoff.lua)."""
        return f"{self.tag}:ho"

    @property
    def receivers(self) -> str:
        """Sorted set of receiver nodes serving the endpoint, scored by when last seen (ms)."""
        return f"{self.tag}:rcv"

    @property
    def pulse_channel(self) -> str:
        return f"{self.tag}:pulse"


class KeySchema:
    """Builds every key and channel name for one key prefix."""

    def __init__(self, prefix: str = "prq", *, sharded: bool = False) -> None:
        if not prefix or any(c in prefix for c in "{}*?[] \r\n\t") or not prefix.isprintable():
            raise ValueError(f"invalid key prefix {prefix!r}: no braces, globs or whitespace")
        self.prefix = prefix
        #: On a Redis Cluster: node channels are shard channels of each endpoint's slot.
        self.sharded = sharded
        self._cache: dict[str, EndpointKeys] = {}

    def endpoint(self, endpoint: str) -> EndpointKeys:
        """Keys of `endpoint` (validated; raises InvalidEndpoint)."""
        keys = self._cache.get(endpoint)
        if keys is None:
            tag = f"{self.prefix}:{{{encode_endpoint(endpoint)}}}"
            node_prefix = f"{tag}:n:" if self.sharded else self.node_channel_prefix
            keys = EndpointKeys(endpoint, tag, node_prefix)
            if len(self._cache) < 10_000:
                self._cache[endpoint] = keys
        return keys

    @property
    def endpoints(self) -> str:
        """Registry of endpoints in use: encoded endpoint -> when a node last used it (ms)."""
        return f"{self.prefix}:endpoints"

    def locator(self, request_id: str) -> str:
        return f"{self.prefix}:loc:{{{request_id}}}"

    def canary(self, node_id: str, n: int = 0) -> str:
        """A node's data-loss canary; on a cluster the node keeps one on every master, each a
        number `n` whose key hashes to a slot that master serves."""
        tag = node_id if n == 0 else f"{node_id}/{n}"
        return f"{self.prefix}:canary:{{{tag}}}"

    def node_channel(self, node_id: str) -> str:
        return f"{self.prefix}:node:{node_id}"

    @property
    def node_channel_prefix(self) -> str:
        """On one server, scripts append a node id to this to reach that node (on a cluster
        each endpoint has its own: EndpointKeys.node_channel_prefix)."""
        return f"{self.prefix}:node:"

    def all_keys_pattern(self) -> str:
        """SCAN pattern for every key of this prefix (tests and admin tools only)."""
        return f"{self.prefix}:*"
