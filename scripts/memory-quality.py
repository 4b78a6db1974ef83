"""Retrieval quality of the station's shared memory on a small, known corpus.

``uv run python scripts/memory-quality.py [--verbose]``

Deposits 40 short documents (written for this script, on distinct everyday technical topics)
into a ``MemoryService`` on a temporary file, in-process, then asks 20 questions worded
differently from the documents, each with one known right document, and prints recall@1,
recall@5 and MRR over the top 10 hits. ``--verbose`` also prints each question's rank.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from macula.services.house import MEMORY_ADD, MEMORY_QUERY
from relay.house.memory import MemoryService, MemoryStore

DEPOSITOR = bytes(range(1, 33))
ASKER = bytes(range(33, 65))
START_MS = 1_767_225_600_000
TOP_K = 10

# document_id -> (source_label, topics, text)
CORPUS: dict[str, tuple[str, list[str], str]] = {
    "tls-rotation": (
        "ops handbook",
        ["tls", "security"],
        "Replacing a TLS certificate before it expires. Request the new certificate while the"
        " current one is still valid, install the new key pair next to the old one, reload the"
        " listener so new handshakes use it, and only then remove the old files.\n\n"
        "A reload, not a restart, keeps open connections alive. Check the chain with openssl"
        " s_client and watch the expiry date in monitoring so it never surprises you again.",
    ),
    "sourdough": (
        "baking notes",
        ["bread", "fermentation"],
        "Keeping a sourdough starter healthy: each day throw away most of it and refresh what is"
        " left with equal weights of flour and water. Kept at room temperature it wants a meal"
        " every twelve hours; in the fridge, once a week is enough. It is ready to bake with"
        " when it has doubled and smells pleasantly sour, and a spoonful floats in water.",
    ),
    "pizza-dough": (
        "baking notes",
        ["pizza", "dough"],
        "Neapolitan pizza dough uses strong flour, water at about 60 to 65 percent of the flour"
        " weight, salt and a pinch of yeast. A long cold rise in the fridge, one to three days,"
        " builds flavour. Stretch the balls by hand, never with a rolling pin, and bake on the"
        " hottest stone or steel your oven allows.",
    ),
    "ssh-keys": (
        "ops handbook",
        ["ssh", "security"],
        "Create an SSH key with ssh-keygen -t ed25519 and protect it with a passphrase. Copy the"
        " public half to the server with ssh-copy-id, which appends it to"
        " ~/.ssh/authorized_keys. Once key login works, disable password authentication in"
        " sshd_config and reload the daemon.",
    ),
    "git-squash": (
        "dev wiki",
        ["git"],
        "To tidy a branch before review, run git rebase -i against the main branch. In the"
        " editor, keep the first line as pick and change the others to squash or fixup to fold"
        " them into a single change with one message. Afterwards the branch must be pushed with"
        " --force-with-lease, since its history was rewritten.",
    ),
    "docker-slim": (
        "dev wiki",
        ["docker", "containers"],
        "Multi-stage builds keep Docker images lean: compile in a first stage with the full"
        " toolchain, then copy only the finished binary or wheel into a slim or distroless base."
        " Put rarely changing layers first so the cache works, add a .dockerignore, and clean"
        " package manager caches in the same RUN line that created them.",
    ),
    "postgres-pitr": (
        "ops handbook",
        ["postgresql", "backup"],
        "PostgreSQL point-in-time recovery combines a base backup taken with pg_basebackup and"
        " continuous archiving of the write-ahead log. To go back to a given moment, restore the"
        " base backup, set recovery_target_time to that timestamp and let the server replay the"
        " archived WAL up to it. Test restores regularly; an untested backup is a hope.",
    ),
    "sqlite-wal": (
        "dev wiki",
        ["sqlite", "databases"],
        "SQLite in WAL journal mode lets readers continue while one writer commits, which suits"
        " web apps with many reads. Set a busy_timeout so a second writer waits instead of"
        " failing at once, and keep the -wal and -shm files next to the database: copying only"
        " the main file while it is open can lose recent commits.",
    ),
    "dns-ttl": (
        "ops handbook",
        ["dns", "networking"],
        "Before moving a site to a new IP address, lower the TTL of its A and AAAA records to a"
        " few minutes and wait at least one old TTL. Resolvers cache answers for as long as the"
        " TTL said, so some people keep reaching the old machine until their cache expires."
        " Keep the old server answering for a day, then raise the TTL again.",
    ),
    "bike-chain": (
        "workshop",
        ["bicycle", "maintenance"],
        "Clean the bicycle chain with a rag and degreaser, let it dry, then put one drop of chain"
        " lube on each roller while turning the pedals backwards. Wipe off the excess after a few"
        " minutes: oil on the outside only collects grit. A chain that creaks or looks orange"
        " needs this; a stretched chain needs replacing.",
    ),
    "espresso": (
        "coffee corner",
        ["coffee"],
        "Dialling in espresso: aim for about 36 g out from 18 g of coffee in 25 to 30 seconds."
        " If the shot pours quickly and tastes sour and thin, grind finer; if it drips slowly and"
        " tastes bitter and harsh, grind coarser. Change one thing at a time and keep the dose"
        " constant while you adjust.",
    ),
    "houseplants": (
        "garden",
        ["plants", "indoor"],
        "Most indoor plants die from too much water rather than too little. Water only when the"
        " top few centimetres of soil are dry, and make sure the pot drains. Yellowing lower"
        " leaves together with soggy, musty-smelling soil point to root rot: repot into fresh"
        " mix and trim any brown, mushy roots.",
    ),
    "tomato-seedlings": (
        "garden",
        ["vegetables", "seedlings"],
        "Tomato seedlings that grow tall, pale and spindly are stretching towards too little"
        " light. Put them under a grow lamp a few centimetres above the leaves for 14 to 16"
        " hours a day, keep them a little cooler, and brush your hand over them daily so the"
        " stems thicken. When transplanting, bury the stem deeper.",
    ),
    "compost": (
        "garden",
        ["compost"],
        "A compost heap needs a mix of greens such as vegetable scraps and grass clippings and"
        " browns such as dry leaves and cardboard, roughly one part to two or three. Keep it as"
        " damp as a wrung-out sponge and turn it every couple of weeks. A smelly heap has too"
        " many greens; a heap that does nothing is too dry or too brown.",
    ),
    "wifi-channels": (
        "home network",
        ["wifi", "networking"],
        "In a crowded building the 2.4 GHz band is full of neighbouring access points. Use a"
        " scanner app to see which channels are busy, and on 2.4 GHz pick only 1, 6 or 11."
        " Better still, move devices to 5 GHz, where channels do not overlap and walls limit"
        " interference from next door.",
    ),
    "python-venv": (
        "dev wiki",
        ["python"],
        "Give every Python project its own virtual environment with python -m venv .venv and"
        " activate it before installing anything, so projects do not fight over package"
        " versions. Record the dependencies in pyproject.toml with a lock file, and never"
        " install packages into the system interpreter with sudo.",
    ),
    "cron": (
        "ops handbook",
        ["linux", "scheduling"],
        "Cron runs commands on a schedule from a crontab edited with crontab -e. The five fields"
        " are minute, hour, day of month, month and day of week, so 0 7 * * 1-5 means seven in"
        " the morning from Monday to Friday. Cron has a minimal PATH, so use absolute paths, and"
        " redirect output to a log file to see failures.",
    ),
    "battery-care": (
        "gadgets",
        ["batteries", "laptops"],
        "Lithium-ion cells wear fastest when kept full and hot. If your laptop or phone offers a"
        " charge limit of around 80 percent, turn it on, avoid leaving the device charging in the"
        " sun or on a bed where it cannot cool, and do not let it sit at zero for long. Capacity"
        " loss over the years is normal; swelling is not.",
    ),
    "password-manager": (
        "security notes",
        ["passwords", "security"],
        "A password manager lets you use a long random password for every site, so one leak"
        " does not open your other accounts. Protect the vault with a strong passphrase and"
        " two-factor authentication, and keep its recovery codes offline. Reused passwords are"
        " the main way accounts get taken over.",
    ),
    "k8s-probes": (
        "platform docs",
        ["kubernetes"],
        "Kubernetes readiness probes decide whether a pod gets traffic from its Service;"
        " liveness probes decide whether the container is restarted. An app that needs time to"
        " warm up should fail readiness until it is done, and use a startup probe so the"
        " liveness probe does not kill it while it is still booting.",
    ),
    "regex-backtracking": (
        "dev wiki",
        ["regex", "performance"],
        "Nested quantifiers such as (a+)+ can make a backtracking regex engine try an exponential"
        " number of paths when the input almost matches, pinning a core for minutes. Rewrite the"
        " pattern so each character can be matched only one way, use possessive quantifiers or"
        " atomic groups, or switch to a linear-time engine such as RE2.",
    ),
    "http-caching": (
        "web notes",
        ["http", "caching"],
        "Serve fingerprinted assets, such as app.3f9a1c.css, with Cache-Control: public,"
        " max-age=31536000, immutable, and serve the HTML that references them with no-cache"
        " so it is revalidated with its ETag on every visit. A deploy then changes the file names"
        " and every browser picks up the new files at once.",
    ),
    "nginx-proxy": (
        "ops handbook",
        ["nginx", "web"],
        "To put nginx in front of an application server, use proxy_pass to the upstream and pass"
        " on the original host and client address with proxy_set_header Host and"
        " X-Forwarded-For. Raise proxy_read_timeout for slow endpoints, and enable the upgrade"
        " headers if the app uses WebSockets.",
    ),
    "unicode-normalization": (
        "dev wiki",
        ["unicode", "text"],
        "The same visible text can be stored as different code point sequences: an accented"
        " letter can be one precomposed character (NFC) or a base letter plus a combining mark"
        " (NFD). Normalise input to NFC before comparing, hashing or using it as a key, or"
        " identical-looking names will not match.",
    ),
    "utc-timestamps": (
        "dev wiki",
        ["time", "databases"],
        "Store instants in UTC and convert to the viewer's zone only for display, using the IANA"
        " zone name such as Europe/Berlin, not a fixed offset, because daylight saving changes"
        " the offset twice a year. For future events like a recurring meeting, store the local"
        " time together with its zone.",
    ),
    "ntp-chrony": (
        "ops handbook",
        ["time", "linux"],
        "Servers should keep their clocks synchronised with chrony or systemd-timesyncd against"
        " several NTP sources. Check the offset with chronyc tracking. Clock drift breaks TLS"
        " validity checks, log correlation and token expiry, so alert when the offset exceeds a"
        " few hundred milliseconds.",
    ),
    "raid": (
        "home server",
        ["storage", "backup"],
        "RAID 1 mirrors two disks so the machine keeps running when one fails, but it copies"
        " mistakes just as faithfully: a deleted file or ransomware is gone from both disks at"
        " once. Redundancy is about uptime; only separate, versioned copies kept elsewhere"
        " protect the data itself.",
    ),
    "zfs-snapshots": (
        "home server",
        ["zfs", "storage"],
        "ZFS snapshots are instant and cost nothing until data changes. Take them on a schedule"
        " with a tool such as sanoid, prune old ones automatically, and use zfs send and receive"
        " to replicate them to another pool. Files can be browsed in the hidden .zfs/snapshot"
        " directory of each dataset.",
    ),
    "email-auth": (
        "ops handbook",
        ["email", "dns"],
        "Mail providers trust a domain that publishes SPF to list its sending servers, signs its"
        " messages with DKIM, and has a DMARC policy telling receivers what to do when both"
        " fail. Start DMARC at p=none with reports, fix the sources that fail, then move to"
        " quarantine. Without these, mail from the domain tends to be filed as junk.",
    ),
    "cast-iron": (
        "kitchen",
        ["cookware"],
        "Cast iron that has gone rusty can be scrubbed back to bare metal with steel wool, dried"
        " on the hob, then rubbed with a thin film of oil and baked upside down at a high"
        " temperature for an hour. Repeat a few times. The polymerised layer is what keeps food"
        " from sticking; avoid soaking the skillet.",
    ),
    "tire-pressure": (
        "garage",
        ["car", "maintenance"],
        "Check tyre pressure monthly, when the tyres are cold, against the figure on the sticker"
        " inside the driver's door rather than the maximum printed on the sidewall. Low pressure"
        " wears the edges, wastes fuel and makes the car handle badly.",
    ),
    "soldering": (
        "workshop",
        ["electronics"],
        "For through-hole soldering, heat the pad and the lead together with a clean, tinned tip,"
        " then feed solder into the joint rather than onto the iron. A good joint is shiny and"
        " shaped like a small volcano. Flux helps the solder flow; clean off residue with"
        " isopropyl alcohol.",
    ),
    "3d-bed-level": (
        "workshop",
        ["3d printing"],
        "When prints will not stick, level the bed with a sheet of paper under the nozzle at each"
        " corner, then tune the Z offset so the first layer is slightly squished. Clean the plate"
        " with isopropyl alcohol, since fingerprints ruin adhesion, and slow the first layer"
        " down.",
    ),
    "oauth-pkce": (
        "security notes",
        ["oauth", "authentication"],
        "Native and single-page apps cannot keep a client secret, so they use the authorisation"
        " code flow with PKCE: the app invents a random code verifier, sends its hash with the"
        " authorisation request and proves possession of the verifier when exchanging the code"
        " for tokens. An intercepted code is useless without it.",
    ),
    "js-memory-leak": (
        "web notes",
        ["javascript", "performance"],
        "To find a memory leak in a web page, take a heap snapshot in the browser's developer"
        " tools, repeat the suspect action a few times, take another and compare them. Detached"
        " DOM nodes and ever-growing arrays held by event listeners or caches are the usual"
        " culprits.",
    ),
    "ups-sizing": (
        "home server",
        ["power"],
        "Size an uninterruptible power supply from the real load of the machines it protects,"
        " measured with a plug-in meter, plus a margin. Pick a model with a USB or network port"
        " and run NUT so the server shuts down cleanly before the battery runs out, and replace"
        " the battery every few years.",
    ),
    "exposure": (
        "photography",
        ["cameras"],
        "Exposure is set by three controls: aperture, which also changes depth of field; shutter"
        " speed, which freezes or blurs motion; and ISO, which brightens the image at the cost"
        " of noise. In dim light, open the aperture first, then slow the shutter as far as you"
        " can hold steady, and raise ISO last.",
    ),
    "token-bucket": (
        "platform docs",
        ["rate limiting", "api"],
        "A token bucket rate limiter refills tokens at a steady rate up to a maximum burst, and"
        " each request spends one. Clients may send a short burst but not exceed the average"
        " rate. Answer 429 with a Retry-After header when the bucket is empty.",
    ),
    "consistent-hashing": (
        "platform docs",
        ["distributed systems"],
        "Consistent hashing places servers and keys on a ring so that adding or removing a"
        " server moves only the keys next to it, instead of reshuffling everything. Virtual"
        " nodes, several points per server, even out the load between machines of equal"
        " size.",
    ),
    "rust-borrowing": (
        "dev wiki",
        ["rust"],
        "Rust's borrow checker allows either one mutable reference or any number of shared"
        " references to a value at a time. When it refuses code, shorten the borrow's scope,"
        " clone cheap data, or restructure so one owner does the mutation; interior mutability"
        " with RefCell is the last resort.",
    ),
}

# (question, the document that answers it); worded differently from the documents
QUESTIONS: list[tuple[str, str]] = [
    (
        "Our HTTPS cert runs out next week; how can I swap in the renewed one without clients"
        " seeing errors?",
        "tls-rotation",
    ),
    ("How often does the wild yeast culture I bake with need refreshing?", "sourdough"),
    ("My branch has a dozen messy commits. How do I turn them into one?", "git-squash"),
    ("The container I ship is 1.2 GB. How can I cut it down?", "docker-slim"),
    (
        "Someone dropped a table at 3pm; can I get Postgres back to just before that?",
        "postgres-pitr",
    ),
    ("I moved my website to another host but some visitors still land on the old box", "dns-ttl"),
    ("My bike's drivetrain squeaks. What should I put on it?", "bike-chain"),
    ("My espresso gushes out in ten seconds and tastes acidic", "espresso"),
    ("Leaves on my fiddle leaf fig are going yellow and the pot smells", "houseplants"),
    (
        "Wireless keeps dropping out in my flat; there are dozens of networks around",
        "wifi-channels",
    ),
    ("Run a backup script automatically every weekday at 7am on Linux", "cron"),
    ("How do I stop my notebook's battery from degrading so quickly?", "battery-care"),
    ("Pods get requests before the app has finished starting up", "k8s-probes"),
    ("A pattern match pegs the CPU at 100% on some user input", "regex-backtracking"),
    ("After a deploy users still get the old stylesheet until they hard refresh", "http-caching"),
    ("My young tomato plants are leggy and flopping over", "tomato-seedlings"),
    ("Messages from our company domain keep ending up in Gmail's spam folder", "email-auth"),
    ("People abroad see the wrong meeting times in our calendar app", "utc-timestamps"),
    ("My disks are mirrored. Do I still need backups?", "raid"),
    ("My skillet has rust spots and eggs stick to it", "cast-iron"),
]


async def measure(path: Path, verbose: int) -> tuple[float, float, float]:
    async with await MemoryStore.open(path) as store:
        service = MemoryService(store)
        now = START_MS
        for document_id, (label, topics, text) in CORPUS.items():
            now += 1000
            payload = {
                "content": text,
                "source_label": label,
                "topics": topics,
                "document_id": document_id,
            }
            outcome = await service.handle(MEMORY_ADD, payload, DEPOSITOR, now)
            if outcome.is_error:
                raise SystemExit(f"deposit {document_id} refused: {outcome.detail!r}")
        ranks = [await rank_of(service, question, wanted, now) for question, wanted in QUESTIONS]
    if verbose:
        for (question, wanted), rank in zip(QUESTIONS, ranks, strict=True):
            print(f"  {rank or '-':>2}  {wanted:<22} {question}")
    n = len(ranks)
    recall_1 = sum(1 for r in ranks if r == 1) / n
    recall_5 = sum(1 for r in ranks if 0 < r <= 5) / n
    mrr = sum(1 / r for r in ranks if r) / n
    return recall_1, recall_5, mrr


async def rank_of(service: MemoryService, question: str, wanted: str, now: int) -> int:
    """The 1-based rank of ``wanted`` among the documents of the top hits, 0 if absent."""
    payload = {"query_text": question, "top_k": TOP_K}
    outcome = await service.handle(MEMORY_QUERY, payload, ASKER, now)
    if outcome.is_error or not isinstance(outcome.payload, dict):
        raise SystemExit(f"query refused: {outcome.detail!r}")
    documents: list[str] = []
    for hit in outcome.payload["hits"]:
        if hit["document_id"] not in documents:
            documents.append(hit["document_id"])
    return documents.index(wanted) + 1 if wanted in documents else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--verbose", action="store_true", help="print each question's rank")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memory-quality-") as directory:
        recall_1, recall_5, mrr = asyncio.run(
            measure(Path(directory) / "memory.sqlite3", int(args.verbose))
        )
    print(f"documents {len(CORPUS)}, questions {len(QUESTIONS)}, top_k {TOP_K}")
    print(f"recall@1 {recall_1:.2f}")
    print(f"recall@5 {recall_5:.2f}")
    print(f"MRR {mrr:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
