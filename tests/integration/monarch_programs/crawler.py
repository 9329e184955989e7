# Monarch's crawler pattern, on a synthetic site (no network): a singleton queue actor
# with an explicit response port that parks waiters, crawlers that loop on
# `.get(timeout=...)` until the queue stays empty.
import time
from collections import deque

from monarch.actor import Actor, Port, ProcMesh, context, endpoint, this_host

DEPTH = 3
NUM_CRAWLERS = 4
TIMEOUT = 1.0


def links_of(page: int) -> list[int]:
    """The synthetic site: page n links to 3n+1 .. 3n+3, and back to page 0."""
    return [3 * page + 1, 3 * page + 2, 3 * page + 3, 0]


class QueueActor(Actor):
    def __init__(self):
        self.q = deque()
        self.seen_links = set()
        self.waiters = deque()

    @endpoint
    def insert(self, item: int, depth: int) -> None:
        if item not in self.seen_links:
            self.seen_links.add(item)
            if self.waiters:
                self.waiters.popleft().send((item, depth))
            else:
                self.q.append((item, depth))

    @endpoint(explicit_response_port=True)
    def get(self, port: Port) -> None:
        if self.q:
            port.send(self.q.popleft())
        else:
            self.waiters.append(port)

    @endpoint
    def seen(self) -> int:
        return len(self.seen_links)


class CrawlActor(Actor):
    def __init__(self, all_queues):
        self.target_queue = all_queues.slice(procs=slice(0, 1))
        self.processed = 0

    def _crawl_internal(self, page: int, depth: int) -> None:
        time.sleep(0.001)  # "fetching"
        for link in links_of(page):
            if depth > 0:
                self.target_queue.insert.broadcast(link, depth - 1)

    @endpoint
    def crawl(self) -> int:
        rank = context().actor_instance.rank
        while True:
            try:
                result = self.target_queue.get.call_one().get(timeout=TIMEOUT)
            except TimeoutError:
                result = None
            if result is None:
                break
            page, depth = result
            print(f"Crawler #{rank} found page {page} @ depth={depth}.")
            self._crawl_internal(page, depth)
            self.processed += 1
        return self.processed


def main():
    local_proc_mesh: ProcMesh = this_host().spawn_procs(per_host={"procs": NUM_CRAWLERS})
    all_queues = local_proc_mesh.spawn("queues", QueueActor)
    target_queue = all_queues.slice(procs=slice(0, 1))
    target_queue.insert.broadcast(0, DEPTH)
    crawlers = local_proc_mesh.spawn("crawlers", CrawlActor, all_queues)
    results = crawlers.crawl.call().get()
    seen = target_queue.seen.call_one().get()
    local_proc_mesh.stop().get()
    pages = sum(v[1] for v in results.items())
    print(f"Finished - Found {pages} (seen {seen}).")
    print(results)


if __name__ == "__main__":
    main()
