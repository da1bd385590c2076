//! The informer's tests: relist diffs, recreated Nodes, the order of cache and handlers, the watch backoff.

use super::*;
use crate::CachedNode;

fn node(name: &str, uid: &str) -> Arc<CachedNode> {
    Arc::new(CachedNode::builder(name, uid, "1").build())
}

fn describe(events: &[InformerEvent<CachedNode>]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            InformerEvent::Added(n) => format!("add {}", n.uid()),
            InformerEvent::Updated(o, n) => format!("update {}->{}", o.uid(), n.uid()),
            InformerEvent::Deleted(n) => format!("delete {}", n.uid()),
        })
        .collect()
}

#[test]
fn a_relist_reports_a_node_recreated_under_its_name_as_a_delete_then_an_add() {
    let before = store::collect(vec![node("a", "a1"), node("b", "b1"), node("gone", "g1")]);
    let after = vec![node("a", "a2"), node("b", "b1"), node("new", "n1")];
    let mut got = describe(&relist_events(before, after));
    let (deletes, rest) = got.split_at_mut(2);
    deletes.sort();
    rest.sort();
    assert_eq!(deletes, ["delete a1", "delete g1"]);
    assert_eq!(rest, ["add a2", "add n1", "update b1->b1"]);
}

#[test]
fn a_watch_event_with_a_new_uid_under_a_known_name_is_a_delete_then_an_add() {
    assert_eq!(
        describe(&apply_events(Some(node("a", "a1")), node("a", "a2"))),
        ["delete a1", "add a2"]
    );
    assert_eq!(
        describe(&apply_events(Some(node("a", "a1")), node("a", "a1"))),
        ["update a1->a1"]
    );
    assert_eq!(describe(&apply_events(None, node("a", "a1"))), ["add a1"]);
}

#[test]
fn a_cache_of_50000_nodes_under_churn_keeps_its_size_instead_of_doubling() {
    let cache = store::Store::new();
    for i in 0..50_000 {
        cache.put(node(&format!("node-{i}"), "u"));
    }
    let start = cache.capacity();
    let mut largest = start;
    for i in 0..60_000 {
        cache.put(node(&format!("node-{}", 50_000 + i), "u"));
        cache.remove(&format!("node-{i}"));
        largest = largest.max(cache.capacity());
    }
    assert_eq!(cache.len(), 50_000);
    assert_eq!(largest, start, "the set stays at its size");
}

/// An informer fed by hand, with a handler that records each event and what the cache held of the
/// event's name at that moment.
struct Fed {
    informer: SharedInformer<CachedNode>,
    handlers: Vec<Handler<CachedNode>>,
    relisted: Vec<Arc<CachedNode>>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Fed {
    fn new() -> Self {
        Self::with(SharedInformer::<CachedNode>::new())
    }

    /// Fed to an informer that holds its handlers' events until it is opened.
    fn closed() -> Self {
        let fed = Self::with(SharedInformer::<CachedNode>::closed());
        fed.informer
            .subscribe(fed.handlers[0].clone())
            .expect("not started");
        fed
    }

    fn with(informer: SharedInformer<CachedNode>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler<CachedNode> = {
            let (informer, seen) = (informer.clone(), seen.clone());
            Arc::new(move |ev: &InformerEvent<CachedNode>| {
                let cached = informer
                    .get(ev.name())
                    .map_or("absent".to_string(), |n| n.uid().to_string());
                let what = describe(std::slice::from_ref(ev)).concat();
                seen.lock().push(format!("{what} (cache: {cached})"));
            })
        };
        Self {
            informer,
            handlers: vec![handler],
            relisted: Vec::new(),
            seen,
        }
    }

    fn feed(&mut self, event: Event<CachedNode>) -> Vec<String> {
        self.informer
            .handle(&self.handlers, "Node", &mut self.relisted, event);
        std::mem::take(&mut *self.seen.lock())
    }
}

fn uids(informer: &SharedInformer<CachedNode>) -> Vec<String> {
    let mut uids: Vec<String> = informer
        .list()
        .iter()
        .map(|n| n.uid().to_string())
        .collect();
    uids.sort();
    uids
}

#[test]
fn handlers_see_the_cache_already_holding_what_each_event_reports() {
    let mut f = Fed::new();
    let one = |n: Arc<CachedNode>| CachedNode::clone(&n);
    assert!(f.feed(Event::Init).is_empty());
    assert!(f.feed(Event::InitApply(one(node("a", "a1")))).is_empty());
    assert!(
        f.informer.get("a").is_none() && !f.informer.has_synced(),
        "a list in progress is not visible"
    );
    assert_eq!(f.feed(Event::InitDone), ["add a1 (cache: a1)"]);
    assert!(f.informer.has_synced());
    assert_eq!(
        f.feed(Event::Apply(one(node("a", "a1")))),
        ["update a1->a1 (cache: a1)"]
    );
    assert_eq!(
        f.feed(Event::Apply(one(node("a", "a2")))),
        ["delete a1 (cache: a2)", "add a2 (cache: a2)"]
    );
    assert_eq!(
        f.feed(Event::Delete(one(node("a", "a2")))),
        ["delete a2 (cache: absent)"]
    );
    // A delete of a name the cache never held still reaches the handlers, with the watch's object.
    assert_eq!(
        f.feed(Event::Delete(one(node("x", "x1")))),
        ["delete x1 (cache: absent)"]
    );
    assert!(f.informer.list().is_empty());
}

#[test]
fn a_relist_replaces_the_cache_whole_and_reports_deletes_before_adds() {
    let mut f = Fed::new();
    let one = |n: Arc<CachedNode>| CachedNode::clone(&n);
    for n in [node("a", "a1"), node("b", "b1"), node("gone", "g1")] {
        f.feed(Event::Apply(one(n)));
    }
    f.feed(Event::Init);
    for n in [node("a", "a2"), node("b", "b1"), node("new", "n1")] {
        f.feed(Event::InitApply(one(n)));
    }
    assert_eq!(
        uids(&f.informer),
        ["a1", "b1", "g1"],
        "the old state until the list is done"
    );
    let got = f.feed(Event::InitDone);
    assert_eq!(uids(&f.informer), ["a2", "b1", "n1"]);
    let (deletes, rest) = got.split_at(2);
    let (mut deletes, mut rest) = (deletes.to_vec(), rest.to_vec());
    deletes.sort();
    rest.sort();
    assert_eq!(
        deletes,
        ["delete a1 (cache: a2)", "delete g1 (cache: absent)"]
    );
    assert_eq!(
        rest,
        [
            "add a2 (cache: a2)",
            "add n1 (cache: n1)",
            "update b1->b1 (cache: b1)"
        ]
    );
}

#[test]
fn a_relist_keeps_the_cached_copy_of_an_unchanged_node_and_takes_a_changed_one() {
    let mut f = Fed::new();
    let at = |uid: &str, rv: &str| CachedNode::builder("a", uid, rv).build();
    f.feed(Event::Apply(at("a1", "5")));
    let cached = f.informer.get("a").expect("cached");
    f.feed(Event::Init);
    f.feed(Event::InitApply(at("a1", "5")));
    f.feed(Event::InitDone);
    let same = f.informer.get("a").expect("cached");
    assert!(
        Arc::ptr_eq(&cached, &same),
        "the same version is not copied again"
    );
    f.feed(Event::Init);
    f.feed(Event::InitApply(at("a1", "6")));
    f.feed(Event::InitDone);
    let newer = f.informer.get("a").expect("cached");
    assert_eq!(newer.resource_version(), "6");
}

#[test]
fn a_relist_started_again_forgets_what_the_broken_one_had_listed() {
    let mut f = Fed::new();
    let one = |n: Arc<CachedNode>| CachedNode::clone(&n);
    f.feed(Event::Init);
    f.feed(Event::InitApply(one(node("half", "h1"))));
    f.feed(Event::Init);
    f.feed(Event::InitApply(one(node("a", "a1"))));
    assert_eq!(f.feed(Event::InitDone), ["add a1 (cache: a1)"]);
    assert_eq!(uids(&f.informer), ["a1"]);
}

#[test]
fn a_held_informer_caches_silently_then_tells_everything_cached_as_added_once_opened() {
    let mut f = Fed::closed();
    let at = |name: &str, uid: &str, rv: &str| CachedNode::builder(name, uid, rv).build();
    f.feed(Event::Init);
    f.feed(Event::InitApply(at("a", "a1", "5")));
    f.feed(Event::InitApply(at("gone", "g1", "6")));
    assert!(
        f.feed(Event::InitDone).is_empty(),
        "nothing told while held"
    );
    assert!(f.feed(Event::Apply(at("b", "b1", "7"))).is_empty());
    assert!(f.feed(Event::Delete(at("gone", "g1", "8"))).is_empty());
    assert!(f.informer.has_synced());
    assert_eq!(uids(&f.informer), ["a1", "b1"], "the cache kept up");

    f.informer.open();
    let mut told = std::mem::take(&mut *f.seen.lock());
    told.sort();
    assert_eq!(told, ["add a1 (cache: a1)", "add b1 (cache: b1)"]);
    f.informer.open();
    assert!(
        f.seen.lock().is_empty(),
        "opening twice tells nothing again"
    );
    assert_eq!(
        f.feed(Event::Apply(at("c", "c1", "9"))),
        ["add c1 (cache: c1)"]
    );
}

#[tokio::test]
async fn the_informer_says_when_it_holds_a_revision_and_counts_completed_lists() {
    let mut f = Fed::new();
    let at = |name: &str, rv: &str| CachedNode::builder(name, name, rv).build();
    f.feed(Event::Init);
    f.feed(Event::InitApply(at("a", "10")));
    f.feed(Event::InitApply(at("b", "12")));
    assert_eq!(f.informer.lists_completed(), 0);
    let holds = |f: &Fed, revision: u64| {
        let informer = f.informer.clone();
        async move {
            tokio::time::timeout(
                Duration::from_millis(50),
                informer.wait_for_revision(revision),
            )
            .await
            .is_ok()
        }
    };
    assert!(!holds(&f, 12).await, "a list in progress holds nothing yet");
    f.feed(Event::InitDone);
    assert_eq!(f.informer.lists_completed(), 1);
    assert!(holds(&f, 12).await && !holds(&f, 13).await);
    f.feed(Event::Apply(at("a", "13")));
    assert!(holds(&f, 13).await);
    // A version that is not a number says nothing about revisions; a delete's does.
    f.feed(Event::Apply(at("a", "not-a-revision")));
    assert!(!holds(&f, 14).await);
    f.feed(Event::Delete(at("b", "20")));
    assert!(holds(&f, 20).await);
    let informer = f.informer.clone();
    let after_one = tokio::spawn(async move { informer.wait_listed_after(1).await });
    f.feed(Event::Init);
    f.feed(Event::InitDone);
    tokio::time::timeout(Duration::from_secs(1), after_one)
        .await
        .expect("a second list completes the wait")
        .expect("joined");
}

#[test]
fn the_watch_backoff_doubles_to_four_seconds_never_gives_up_and_starts_over_after_a_success() {
    use kube::runtime::utils::Backoff;
    let mut b = watch_backoff();
    let delays: Vec<Duration> = (0..20).filter_map(|_| b.next()).collect();
    assert_eq!(delays.len(), 20, "it never gives up");
    assert!(delays[0] >= Duration::from_millis(250) && delays[0] < Duration::from_millis(500));
    assert!(delays[1] >= Duration::from_millis(500));
    assert!(
        delays.iter().all(|d| *d < Duration::from_secs(8)),
        "{delays:?}"
    );
    assert!(delays[19] >= Duration::from_secs(4));
    b.reset();
    assert!(b.next().is_some_and(|d| d < Duration::from_millis(500)));
}

#[test]
fn every_handler_queueing_an_events_name_shares_one_string() {
    let informer: SharedInformer<CachedNode> = SharedInformer::new();
    let seen = Arc::new(Mutex::new(Vec::<Arc<str>>::new()));
    for _ in 0..2 {
        let (keys, seen) = (informer.name_keys(), seen.clone());
        informer
            .subscribe(Arc::new(move |ev: &InformerEvent<CachedNode>| {
                seen.lock().push(keys.key(ev.name()));
            }))
            .expect("subscribe");
    }
    let handlers = informer.shared.handlers.lock().clone();
    informer.dispatch(&handlers, InformerEvent::Added(node("a", "a1")));
    informer.dispatch(&handlers, InformerEvent::Added(node("b", "b1")));
    let seen = seen.lock();
    let names: Vec<&str> = seen.iter().map(|k| &**k).collect();
    assert_eq!(names, ["a", "a", "b", "b"]);
    assert!(
        Arc::ptr_eq(&seen[0], &seen[1]),
        "one allocation for both queues"
    );
    assert!(Arc::ptr_eq(&seen[2], &seen[3]));
    assert!(!Arc::ptr_eq(&seen[1], &seen[2]));
}
