//! ArtemisQueue (issue 4) on the real test bed: create on every live node, converge, repair,
//! dry run, the delete preview and the delete with ADR-0084's checks.

use std::time::Duration;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use artemis_studio_operator::api::queue::ArtemisQueue;
use artemis_studio_operator::api::{Outcome, RefusalKind};
use artemis_studio_operator::topology::{self, Topology};

use crate::support::{
    CleanUp, OperatorHandle, RestoreHa, TestBed, amqp_consumer, brokers_exclusive, brokers_shared,
    create_cluster, send_messages, short_id, wait_cluster_condition, wait_until,
};

pub struct Fixture {
    pub bed: TestBed,
    pub ns: String,
    pub admin: Client,
    pub op: OperatorHandle,
    /// Sweeps the brokers of the test's objects (its ids, added with `also`); last, so the
    /// operator has stopped first.
    pub clean: CleanUp,
}

pub async fn fixture(prefix: &str, bulk_cap: Option<u64>) -> Fixture {
    let spec = bulk_cap.map(|cap| json!({"bulkCap": cap}));
    fixture_on(prefix, "c", TestBed::broker_user, spec).await
}

/// A fresh namespace with its own operator and an ArtemisCluster `cluster` over the bed's
/// brokers of that name, reached as `user`, with `spec` merged into its spec, once Ready.
pub async fn fixture_on(
    prefix: &str,
    cluster: &str,
    user: fn(&TestBed) -> (String, String),
    spec: Option<serde_json::Value>,
) -> Fixture {
    let bed = TestBed::get();
    let ns = bed.fresh_namespace(prefix).await;
    let clean = bed.clean_up(&[]);
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed
        .cluster_brokers(cluster)
        .into_iter()
        .map(|b| b.jolokia)
        .collect();
    create_cluster(&admin, &ns, cluster, &urls, Some(user(&bed))).await;
    if let Some(spec) = spec {
        let api: Api<artemis_studio_operator::api::ArtemisCluster> = Api::namespaced(admin.clone(), &ns);
        api.patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": spec})),
        )
        .await
        .expect("patch the cluster's spec");
    }
    wait_cluster_condition(&admin, &ns, cluster, "Ready", "True").await;
    Fixture {
        bed,
        ns,
        admin,
        op,
        clean,
    }
}

impl Fixture {
    /// Stop this fixture's operator and start another process of the same installation (its
    /// instance ID) on the database `db`.
    pub async fn restart_operator_on(&mut self, db: &str) {
        let instance = self.op.ctx.instance_id.clone();
        self.op.stop();
        self.op = self
            .bed
            .start_operator_on(&[self.ns.as_str()], db, &instance)
            .await;
    }

    pub fn queues(&self) -> Api<ArtemisQueue> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    pub async fn create(&self, name: &str, spec: serde_json::Value) {
        let mut spec = spec;
        spec["clusterRef"] = json!({"name": "c"});
        let q: ArtemisQueue = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
            "metadata": {"name": name}, "spec": spec
        }))
        .expect("queue json");
        self.queues()
            .create(&PostParams::default(), &q)
            .await
            .expect("create ArtemisQueue");
    }

    pub async fn wait_for(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ArtemisQueue) -> bool,
    ) -> ArtemisQueue {
        let api = self.queues();
        let check = &check;
        wait_until(
            &format!("ArtemisQueue {name}: {what}"),
            Duration::from_secs(90),
            || {
                let api = api.clone();
                async move { api.get(name).await.ok().filter(|q| check(q)) }
            },
        )
        .await
    }

    pub async fn wait_gone(&self, name: &str) {
        let api = self.queues();
        wait_until(
            &format!("ArtemisQueue {name} deleted"),
            Duration::from_secs(90),
            || {
                let api = api.clone();
                async move {
                    api.get_opt(name)
                        .await
                        .ok()
                        .and_then(|o| o.is_none().then_some(()))
                }
            },
        )
        .await;
    }

    pub async fn topology(&self) -> Topology {
        topology::poll(&self.bed.access("c", self.bed.broker_user()), &Default::default()).await
    }

    pub async fn audit_rows(&self, command_prefix: &str) -> Vec<(String, String, serde_json::Value)> {
        sqlx::query_as(
            "SELECT command, outcome, outcome_detail FROM audit_event WHERE command LIKE $1 ORDER BY id",
        )
        .bind(format!("{command_prefix}%"))
        .fetch_all(self.op.store.pool())
        .await
        .expect("audit rows")
    }

    /// The reasons of the Events on the object `name`, oldest first: once the Events the
    /// operator queued are published.
    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        self.op.ctx.events.settled().await;
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.admin.clone(), &self.ns);
        let mut on: Vec<_> = events
            .list(&Default::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        on.sort_by_key(|e| e.metadata.creation_timestamp.clone());
        on.into_iter().filter_map(|e| e.reason).collect()
    }
}

pub fn condition(q: &ArtemisQueue, type_: &str) -> Option<(String, String, String)> {
    q.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub fn outcomes(q: &ArtemisQueue) -> Vec<Outcome> {
    q.status
        .as_ref()
        .map(|s| s.nodes.iter().map(|n| n.outcome).collect())
        .unwrap_or_default()
}

/// Ready=True: every live node APPLIED or ALREADY.
pub fn ready(q: &ArtemisQueue) -> bool {
    condition(q, "Ready").is_some_and(|c| c.0 == "True")
}

fn all(q: &ArtemisQueue, o: Outcome) -> bool {
    let os = outcomes(q);
    os.len() == 3 && os.iter().all(|x| *x == o)
}

#[tokio::test]
async fn a_queue_is_created_on_every_node_and_reapplying_is_already_without_audit() {
    let _b = brokers_shared().await;
    let f = fixture("q-create", None).await;
    // Not `orders.…`: the README walk-through's capture pattern `orders.#` runs beside it on
    // these brokers, and its confirmation names the addresses it matched.
    let id = short_id();
    f.clean.also(&id);
    let name = format!("created.{id}");
    f.create(&name, json!({"routingType": "ANYCAST"})).await;
    let q = f.wait_for(&name, "Ready", ready).await;
    // kstatus agrees: neither reconciling nor stalled.
    for t in ["Reconciling", "Stalled"] {
        assert_eq!(condition(&q, t).map(|c| c.0).as_deref(), Some("False"), "{t}");
    }
    // The command applied on all three nodes: its audit row says so, per node.
    let rows = f.audit_rows("queue.").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let applied = rows[0].2["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(applied.len(), 3);
    assert!(applied.iter().all(|n| n["outcome"] == "APPLIED"), "{applied:?}");
    assert_eq!(
        q.status.as_ref().and_then(|s| s.nodes_summary.clone()).as_deref(),
        Some("3/3")
    );
    assert!(
        q.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == "artemis-studio.io/queue")
    );
    for n in f.topology().await.nodes {
        let inv = n.inventory.expect("inventory");
        assert_eq!(
            inv.queues.get(&name).map(|q| q.routing_type.as_str()),
            Some("ANYCAST"),
            "{}",
            n.node_id
        );
    }
    // Status keeps what was done: each node APPLIED, naming the command's audit row.
    let audit_id = q
        .status
        .as_ref()
        .and_then(|s| s.last_audit_id)
        .expect("last audit id");
    for n in &q.status.as_ref().expect("status").nodes {
        assert_eq!(n.outcome, Outcome::Applied, "{n:?}");
        let lc = n.last_command.as_ref().expect("last command");
        assert_eq!((lc.command.as_str(), lc.audit_id), ("queue.apply", audit_id));
    }
    // Later passes find it converged: no new audit row, and APPLIED is not overwritten.
    let passes = f.op.ctx.metrics.reconciles_of("ArtemisQueue");
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("label");
    wait_until("a later queue pass", Duration::from_secs(60), || async {
        (f.op.ctx.metrics.reconciles_of("ArtemisQueue") > passes).then_some(())
    })
    .await;
    let q = f.queues().get(&name).await.expect("get");
    assert!(all(&q, Outcome::Applied), "{:?}", q.status);
    let rows = f.audit_rows("queue.").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, "succeeded");
    let preview = f
        .queues()
        .get(&name)
        .await
        .expect("get")
        .status
        .and_then(|s| s.delete_preview)
        .expect("deletePreview");
    assert_eq!(preview.nodes.len(), 3);
    assert!(!preview.exceeds_bulk_cap);
    // A new object's create is told by its status and its audit row, not by an Event.
    assert_eq!(f.event_reasons(&name).await, Vec::<String>::new());
    // Issue 45: so is the delete of an empty queue nobody uses: by the object's going (the
    // finalizer is released after the command's Event would have been published) and its row.
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_gone(&name).await;
    let deleted = f.audit_rows("queue.delete").await;
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert_eq!(deleted[0].1, "succeeded");
    assert_eq!(f.event_reasons(&name).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_filter_change_touches_only_the_filter_and_keeps_unmentioned_fields() {
    let _b = brokers_shared().await;
    let f = fixture("q-filter", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("adopted.{id}");
    // The queue exists before the object (adopted), with a field the spec never mentions.
    for n in f.topology().await.live_nodes() {
        n.active
            .as_ref()
            .expect("live")
            .create_queue(&json!({"name": name, "address": name, "routing-type": "ANYCAST", "max-consumers": 5, "auto-create-address": true}))
            .await
            .expect("pre-create");
    }
    f.create(&name, json!({"filter": "color='red'"})).await;
    f.wait_for(&name, "Ready", ready).await;
    let rows = f.audit_rows("queue.").await;
    let updated_everywhere = |r: &(String, String, serde_json::Value)| {
        r.2["nodes"].as_array().is_some_and(|ns| {
            ns.len() == 3
                && ns.iter().all(|n| {
                    n["outcome"] == "APPLIED"
                        && n["message"].as_str().is_some_and(|m| m.contains("filter-string"))
                })
        })
    };
    assert!(
        rows.iter().any(updated_everywhere),
        "one command updated the filter on all three nodes: {rows:?}"
    );
    // A change to queues that existed before the object is told by an Event on it.
    assert_eq!(f.event_reasons(&name).await, vec!["Applied".to_string()]);
    for n in f.topology().await.nodes {
        let inv = n.inventory.expect("inventory");
        let got = inv.queues.get(&name).expect("queue");
        assert_eq!(got.filter.as_deref(), Some("color='red'"), "{}", n.node_id);
        assert_eq!(
            got.max_consumers, 5,
            "a field the spec never mentioned survives on {}",
            n.node_id
        );
    }
    // Edit the filter: it changes on every node, nothing else does.
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"filter": "color='blue'"}})),
        )
        .await
        .expect("patch filter");
    wait_until(
        "the new filter on every node",
        Duration::from_secs(60),
        || async {
            let t = f.topology().await;
            t.nodes
                .iter()
                .all(|n| {
                    n.inventory
                        .as_ref()
                        .and_then(|i| i.queues.get(&name))
                        .is_some_and(|q| q.filter.as_deref() == Some("color='blue'") && q.max_consumers == 5)
                })
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_queue_with_the_other_routing_type_is_refused_not_recreated() {
    let _b = brokers_shared().await;
    let f = fixture("q-rt", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("rt.{id}");
    let t = f.topology().await;
    let first = t.live_nodes().next().expect("a live node");
    first
        .active
        .as_ref()
        .expect("live")
        .create_queue(
            &json!({"name": name, "address": name, "routing-type": "MULTICAST", "auto-create-address": true}),
        )
        .await
        .expect("pre-create as MULTICAST");
    f.create(&name, json!({"routingType": "ANYCAST"})).await;
    let q = f
        .wait_for(&name, "one node FAILED", |q| {
            outcomes(q).contains(&Outcome::Failed)
                && outcomes(q)
                    .iter()
                    .filter(|o| **o == Outcome::Applied || **o == Outcome::Already)
                    .count()
                    == 2
        })
        .await;
    let status = q.status.expect("status");
    let failed = status
        .nodes
        .iter()
        .find(|n| n.outcome == Outcome::Failed)
        .expect("failed node");
    assert_eq!(failed.node, first.node_id);
    assert_eq!(failed.refusal, Some(RefusalKind::RoutingTypeImmutable));
    assert!(failed.message.contains("spec.routingType"), "{}", failed.message);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(ready.status, "False");
    let diverged = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Diverged")
        .expect("Diverged");
    assert!(diverged.message.contains(&first.node_id));
    // Still MULTICAST on that node: never deleted and re-created.
    let again = f.topology().await;
    let q = again
        .find(&first.node_id)
        .and_then(|n| n.inventory.clone())
        .and_then(|i| i.queues.get(&name).cloned());
    assert_eq!(q.map(|q| q.routing_type), Some("MULTICAST".to_string()));
}

#[tokio::test]
async fn a_queue_destroyed_behind_our_back_is_recreated_and_audited() {
    let _b = brokers_shared().await;
    let f = fixture("q-repair", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("repair.{id}");
    f.create(&name, json!({})).await;
    f.wait_for(&name, "Ready", ready).await;
    let t = f.topology().await;
    let victim = t.live_nodes().next().expect("live");
    victim
        .active
        .as_ref()
        .expect("live")
        .destroy_queue(&name, false)
        .await
        .expect("destroy out of band");
    wait_until(
        "the queue is back on the node",
        Duration::from_secs(60),
        || async {
            let t = f.topology().await;
            t.find(&victim.node_id)?
                .inventory
                .as_ref()?
                .queues
                .get(&name)
                .map(|_| ())
        },
    )
    .await;
    let rows = f.audit_rows("queue.").await;
    assert_eq!(rows.len(), 2, "the create and the repair: {rows:?}");
    assert_eq!(rows[1].0, "queue.repair");
    let applied = rows[1].2["appliedNodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(applied, vec![json!(victim.node_id)]);
}

#[tokio::test]
async fn a_dry_run_never_changes_the_broker() {
    let _b = brokers_shared().await;
    let f = fixture("q-dry", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("dry.{id}");
    let before = f.topology().await;
    f.create(&name, json!({"dryRun": true, "filter": "x=1"})).await;
    let q = f
        .wait_for(&name, "WOULD_APPLY x3", |q| all(q, Outcome::WouldApply))
        .await;
    // A dry run is what the user asked for: neither Stalled (Flux: Failed) nor Reconciling.
    assert_eq!(
        condition(&q, "Stalled").map(|c| (c.0, c.1)),
        Some(("False".into(), "DryRun".into()))
    );
    assert_eq!(
        condition(&q, "Reconciling").map(|c| c.0).as_deref(),
        Some("False")
    );
    assert!(
        q.status
            .expect("status")
            .nodes
            .iter()
            .all(|n| n.message.contains("create"))
    );
    let after = f.topology().await;
    for (a, b) in before.nodes.iter().zip(after.nodes.iter()) {
        let (a, b) = (
            a.inventory.as_ref().expect("inv"),
            b.inventory.as_ref().expect("inv"),
        );
        assert!(!b.queues.contains_key(&name));
        assert!(!b.addresses.contains_key(&name));
        // Diverts touching this queue's address (other tests make their own concurrently).
        let mine = |i: &artemis_studio_operator::topology::inventory::NodeInventory| {
            i.diverts
                .values()
                .filter(|d| d.address == name || d.forwarding_address == name)
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(mine(a), mine(b));
    }
    assert!(f.audit_rows("queue.").await.is_empty());
    // Deleting a dry-run object touches nothing either (the queue does not exist: ALREADY).
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_gone(&name).await;
}

#[tokio::test]
async fn delete_removes_dependent_diverts_first_and_keeps_source_diverts() {
    let _b = brokers_shared().await;
    let f = fixture("q-divert", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (name, source, other) = (
        format!("target.{id}"),
        format!("source.{id}"),
        format!("other.{id}"),
    );
    f.create(&name, json!({})).await;
    f.wait_for(&name, "Ready", ready).await;
    let t = f.topology().await;
    for n in t.live_nodes() {
        let m = n.active.as_ref().expect("live");
        m.create_address(&source, "MULTICAST")
            .await
            .expect("source address");
        m.create_queue(
            &json!({"name": other, "address": other, "routing-type": "ANYCAST", "auto-create-address": true}),
        )
        .await
        .expect("other queue");
        m.create_divert(&json!({"name": format!("into.{id}"), "routing-name": format!("into.{id}"), "address": source, "forwarding-address": name, "exclusive": false})).await.expect("divert into");
        m.create_divert(&json!({"name": format!("out.{id}"), "routing-name": format!("out.{id}"), "address": name, "forwarding-address": other, "exclusive": false})).await.expect("divert out");
    }
    // The preview names both, per node.
    let q = f
        .wait_for(&name, "preview with diverts", |q| {
            q.status
                .as_ref()
                .and_then(|s| s.delete_preview.as_ref())
                .is_some_and(|p| {
                    p.nodes.len() == 3
                        && p.nodes
                            .iter()
                            .all(|n| n.dependent_diverts.len() == 1 && n.kept_diverts.len() == 1)
                })
        })
        .await;
    let p = q.status.and_then(|s| s.delete_preview).expect("preview");
    assert!(p.nodes[0].dependent_diverts[0].note.contains("broker.xml"));
    assert!(p.nodes[0].kept_diverts[0].note.contains("still routes"));

    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    f.wait_gone(&name).await;
    for n in f.topology().await.nodes {
        let inv = n.inventory.expect("inventory");
        assert!(!inv.queues.contains_key(&name), "queue gone on {}", n.node_id);
        assert!(
            !inv.diverts.contains_key(&format!("into.{id}")),
            "dependent divert removed on {}",
            n.node_id
        );
        assert!(
            inv.diverts.contains_key(&format!("out.{id}")),
            "source divert kept on {}",
            n.node_id
        );
    }
    let rows = f.audit_rows("queue.delete").await;
    assert_eq!(rows.len(), 1);
    // A delete that removed other objects' diverts is told by an Event too.
    let reasons = f.event_reasons(&name).await;
    assert!(reasons.iter().any(|r| r == "Applied"), "{reasons:?}");
    let detail = rows[0].2.to_string();
    assert!(
        detail.contains(&format!("into.{id}")) && detail.contains("forwarding-address"),
        "the removed divert's full configuration is audited: {detail}"
    );
}

/// A queue (`{prefix}.{id}`) and a MULTICAST source address (`{prefix}src.{id}`) made behind
/// the operator's back on one live node: that node's management, the queue, the source.
async fn queue_and_source_on_a_node(
    f: &Fixture,
    prefix: &str,
    id: &str,
) -> (artemis_studio_operator::broker::BrokerManagement, String, String) {
    let (target, source) = (format!("{prefix}.{id}"), format!("{prefix}src.{id}"));
    let t = f.topology().await;
    let n = t.live_nodes().next().expect("a live node");
    let m = n.active.clone().expect("live");
    m.create_queue(
        &json!({"name": target, "address": target, "routing-type": "ANYCAST", "auto-create-address": true}),
    )
    .await
    .expect("queue");
    m.create_address(&source, "MULTICAST")
        .await
        .expect("source address");
    (m, target, source)
}

/// Issue 45: a delete's preflight asks the node's DivertNames beside an exact read of each
/// divert its last poll found, instead of the pattern read; when the node lists one that was not
/// read (here made behind the operator's back just now, on a node that had none, then beside one
/// it knew), every divert is read, so the delete still removes those that forward into its
/// address first.
#[tokio::test]
async fn a_preflight_asking_divert_names_reads_every_divert_once_the_node_lists_one() {
    use artemis_studio_operator::topology::inventory::{DivertsRead, QueueAt, ScopedRead, read_scoped};
    let _b = brokers_shared().await;
    let f = fixture("q-names", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (m, target, source) = queue_and_source_on_a_node(&f, "named", &id).await;
    let m = &m;
    let divert = format!("into.{id}");
    m.create_divert(&json!({"name": divert, "routing-name": divert, "address": source, "forwarding-address": target, "exclusive": false}))
        .await
        .expect("divert");
    let queues = [QueueAt {
        name: &target,
        address: &target,
        routing_type: "ANYCAST",
    }];
    let scope = ScopedRead {
        queues: &queues,
        addresses: &[],
        diverts: DivertsRead::Listed {
            known: &Default::default(),
        },
    };
    let first = read_scoped(m, &scope).await.expect("read");
    let inv = &first;
    assert!(inv.queues.contains_key(&target), "the queue itself is read");
    let found = inv
        .diverts
        .get(&divert)
        .expect("the divert the node lists is read in full");
    assert_eq!(found.forwarding_address, target);
    // The node's last read knew the first divert; a second appears behind the operator's back.
    let second = format!("into2.{id}");
    m.create_divert(&json!({"name": second, "routing-name": second, "address": source, "forwarding-address": target, "exclusive": false}))
        .await
        .expect("second divert");
    let scope = ScopedRead {
        diverts: DivertsRead::Listed {
            known: &first.diverts,
        },
        ..scope
    };
    let inv = read_scoped(m, &scope).await.expect("read");
    for d in [&divert, &second] {
        let found = inv.diverts.get(d).expect("every divert the node lists is read");
        assert_eq!(found.forwarding_address, target, "{d}");
    }
    for d in [&divert, &second] {
        m.destroy_divert(d).await.expect("divert removed");
    }
    m.destroy_queue(&target, true).await.expect("queue removed");
}

/// Issue 45: every live node gets the divert watch (the operator makes it, audited, or finds it
/// made by another installation), and the operator's full read marks it. A delete's preflight
/// then reads the diverts the node held by name beside the watch, with no `DivertNames`; a
/// divert made behind the operator's back since the mark moves the watch, so it is read too,
/// and a watch destroyed behind its back reads every divert by the pattern until the operator
/// makes it again.
#[tokio::test]
async fn the_divert_watch_counts_a_divert_made_behind_our_back_and_a_delete_reads_it() {
    use artemis_studio_operator::topology::divert_watch;
    use artemis_studio_operator::topology::inventory::{
        DivertsRead, QueueAt, ScopedRead, Watch, read_scoped, scrape,
    };
    let _b = brokers_shared().await;
    let f = fixture("q-watch", None).await;
    let id = short_id();
    f.clean.also(&id);
    let key = format!("{}/c", f.ns);
    let marked = || async {
        let t = f.op.ctx.topologies.get(&key)?;
        let live: Vec<_> = t.live_nodes().collect();
        let all = !live.is_empty()
            && live.iter().all(|n| {
                n.inventory
                    .as_ref()
                    .is_some_and(|i| i.divert_watch.mark().is_some())
            });
        all.then_some(())
    };
    wait_until(
        "every live node's watch marked by the operator's poll",
        Duration::from_secs(120),
        marked,
    )
    .await;
    for (command, outcome, _) in f.audit_rows("divertwatch.").await {
        assert_eq!(
            (command.as_str(), outcome.as_str()),
            ("divertwatch.create", "succeeded")
        );
    }
    let (m, target, source) = queue_and_source_on_a_node(&f, "watched", &id).await;
    let m = &m;
    let into = |d: &str| json!({"name": d, "routing-name": d, "address": source, "forwarding-address": target, "exclusive": false});
    let first = format!("into.{id}");
    m.create_divert(&into(&first)).await.expect("divert");
    let polled = scrape(m).await.expect("a full read");
    let mark = polled.divert_watch.mark().expect("the full read marks the watch");
    let queues = [QueueAt {
        name: &target,
        address: &target,
        routing_type: "ANYCAST",
    }];
    let watched = ScopedRead {
        queues: &queues,
        addresses: &[],
        diverts: DivertsRead::Watched {
            known: &polled.diverts,
            mark,
        },
    };
    let inv = read_scoped(m, &watched).await.expect("read");
    assert_eq!(
        inv.diverts.get(&first).map(|d| d.forwarding_address.as_str()),
        Some(target.as_str())
    );
    // A second divert into the queue's address, behind the operator's back, after the mark.
    let second = format!("into2.{id}");
    m.create_divert(&into(&second)).await.expect("second divert");
    let inv = read_scoped(m, &watched).await.expect("read");
    for d in [&first, &second] {
        let found = inv.diverts.get(d).expect("the watch moved: every divert is read");
        assert_eq!(found.forwarding_address, target, "{d}");
    }
    // The watch destroyed behind the operator's back: every divert is read by the pattern, and
    // the operator makes it again (a new incarnation, marked by its next full read).
    m.destroy_queue(divert_watch::QUEUE, true)
        .await
        .expect("watch destroyed");
    let inv = read_scoped(m, &watched).await.expect("read");
    assert!(
        inv.diverts.contains_key(&second),
        "read by the pattern without the watch"
    );
    let again = || async {
        match scrape(m).await.ok()?.divert_watch {
            Watch::Live(w) if w.id != mark.id => Some(()),
            _ => None,
        }
    };
    wait_until("the watch made again", Duration::from_secs(120), again).await;
    for d in [&first, &second] {
        m.destroy_divert(d).await.expect("divert removed");
    }
    m.destroy_queue(&target, true).await.expect("queue removed");
}

#[tokio::test]
async fn delete_over_the_bulk_cap_is_refused_until_message_loss_is_allowed() {
    let _b = brokers_shared().await;
    let f = fixture_on(
        "q-cap",
        "c",
        TestBed::broker_user,
        Some(json!({"messageLossCap": 2})),
    )
    .await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("cap.{id}");
    f.create(&name, json!({})).await;
    f.wait_for(&name, "Ready", ready).await;
    send_messages(&f.bed, "c1", &name, 3).await;
    f.wait_for(&name, "preview counts 3 messages", |q| {
        q.status
            .as_ref()
            .and_then(|s| s.delete_preview.as_ref())
            .is_some_and(|p| p.total_messages == 3 && p.exceeds_bulk_cap)
    })
    .await;
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let q = f
        .wait_for(&name, "DeleteBlocked BulkCapExceeded", |q| {
            condition(q, "DeleteBlocked").is_some_and(|c| c.1 == "BulkCapExceeded")
        })
        .await;
    let (_, _, message) = condition(&q, "DeleteBlocked").expect("condition");
    assert!(message.contains("allowMessageLoss: 3"), "{message}");
    assert!(
        f.audit_rows("queue.delete").await.is_empty(),
        "a refused delete sends nothing"
    );
    // The user unblocks it by editing deletion on the terminating object.
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletion": {"allowMessageLoss": 3}}})),
        )
        .await
        .expect("allow the loss");
    f.wait_gone(&name).await;
    let rows = f.audit_rows("queue.delete").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, "succeeded");
    // A delete that destroyed messages is told by an Event besides its audit row.
    let reasons = f.event_reasons(&name).await;
    assert!(reasons.iter().any(|r| r == "Applied"), "{reasons:?}");
}

#[tokio::test]
async fn delete_with_a_consumer_is_refused_until_consumers_may_be_disconnected() {
    let _b = brokers_shared().await;
    let f = fixture("q-cons", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("consumed.{id}");
    f.create(&name, json!({})).await;
    f.wait_for(&name, "Ready", ready).await;
    let consumer = amqp_consumer(&f.bed, "c1", &name, &format!("app-{}", short_id())).await;
    f.wait_for(&name, "preview sees the consumer", |q| {
        q.status
            .as_ref()
            .and_then(|s| s.delete_preview.as_ref())
            .is_some_and(|p| p.nodes.iter().any(|n| n.consumer_count == 1))
    })
    .await;
    f.queues()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let q = f
        .wait_for(&name, "HAS_CONSUMERS", |q| {
            q.status.as_ref().is_some_and(|s| {
                s.nodes
                    .iter()
                    .any(|n| n.refusal == Some(RefusalKind::HasConsumers))
            })
        })
        .await;
    let refused = q
        .status
        .expect("status")
        .nodes
        .into_iter()
        .find(|n| n.refusal == Some(RefusalKind::HasConsumers))
        .expect("refused");
    assert!(
        refused.message.contains("1 consumer") && refused.message.contains("disconnectConsumers"),
        "{}",
        refused.message
    );
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"deletion": {"disconnectConsumers": true}}})),
        )
        .await
        .expect("allow disconnect");
    f.wait_gone(&name).await;
    let mut receiver = consumer.receiver;
    let detached = tokio::time::timeout(
        Duration::from_secs(30),
        receiver.recv::<fe2o3_amqp::types::primitives::Value>(),
    )
    .await;
    assert!(
        matches!(detached, Ok(Err(_))),
        "the consumer sees the disconnect: {detached:?}"
    );
    drop(consumer.session);
    drop(consumer.connection);
}

#[tokio::test]
async fn a_node_that_was_down_gets_the_queue_when_it_comes_back() {
    let _b = brokers_exclusive().await;
    let f = fixture("q-late", None).await;
    f.bed.broker_action("stop", "c3");
    // What a user sees first: the cluster reports the node as not live.
    wait_until(
        "the cluster reports 2 live nodes",
        Duration::from_secs(60),
        || async {
            let c: artemis_studio_operator::api::ArtemisCluster =
                Api::namespaced(f.admin.clone(), &f.ns).get("c").await.ok()?;
            (c.status?.live_nodes == 2).then_some(())
        },
    )
    .await;
    struct Start<'a>(&'a TestBed);
    impl Drop for Start<'_> {
        fn drop(&mut self) {
            self.0.broker_action("start", "c3");
        }
    }
    let _start = Start(&f.bed);
    let id = short_id();
    f.clean.also(&id);
    let name = format!("late.{id}");
    f.create(&name, json!({})).await;
    let q = f
        .wait_for(&name, "2 in the requested state + 1 SKIPPED_NOT_LIVE", |q| {
            let os = outcomes(q);
            os.iter()
                .filter(|o| matches!(o, Outcome::Applied | Outcome::Already))
                .count()
                == 2
                && os.contains(&Outcome::SkippedNotLive)
        })
        .await;
    let diverged = condition(&q, "Diverged").expect("Diverged");
    assert_eq!(diverged.0, "True");
    assert!(diverged.2.contains("not live"), "{}", diverged.2);
    f.bed.broker_action("start", "c3");
    f.wait_for(&name, "Ready on all three", |q| {
        condition(q, "Ready").is_some_and(|c| c.0 == "True")
            && outcomes(q).len() == 3
            && !outcomes(q).contains(&Outcome::SkippedNotLive)
    })
    .await;
    let rows = f.audit_rows("queue.").await;
    assert_eq!(
        rows.len(),
        2,
        "the create, then the repair on the returning node: {rows:?}"
    );
    assert!(rows.iter().all(|r| r.1 == "succeeded"), "{rows:?}");
    assert_eq!(
        rows[1].2["appliedNodes"].as_array().map(Vec::len),
        Some(1),
        "the repair touched only the returning node"
    );
}

#[tokio::test]
async fn after_failover_the_queue_is_on_the_promoted_backup_under_the_same_logical_node() {
    let _b = brokers_exclusive().await;
    let restore_bed = TestBed::get();
    let _restore = RestoreHa(&restore_bed);
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("q-ha").await;
    let clean = bed.clean_up(&[]);
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("ha").into_iter().map(|b| b.jolokia).collect();
    create_cluster(&admin, &ns, "c", &urls, Some(bed.broker_user())).await;
    wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let f = Fixture {
        bed,
        ns,
        admin,
        op,
        clean,
    };
    let id = short_id();
    f.clean.also(&id);
    let name = format!("ha.{id}");
    f.create(&name, json!({})).await;
    let q = f
        .wait_for(&name, "Ready on both logical nodes", |q| {
            ready(q) && outcomes(q).len() == 2
        })
        .await;
    let ha1b = f.bed.broker("ha1b").jolokia;
    let pair_node = q
        .status
        .expect("status")
        .nodes
        .into_iter()
        .find(|n| n.endpoint.as_deref() == Some(f.bed.broker("ha1").jolokia.as_str()))
        .expect("the pair's logical node, targeted at the primary")
        .node;

    f.bed.broker_action("kill", "ha1");
    let q = f
        .wait_for(&name, "the pair's node served by the promoted backup", |q| {
            ready(q)
                && outcomes(q).len() == 2
                && q.status.as_ref().is_some_and(|s| {
                    s.nodes
                        .iter()
                        .any(|n| n.node == pair_node && n.endpoint.as_deref() == Some(ha1b.as_str()))
                })
        })
        .await;
    assert_eq!(outcomes(&q).len(), 2, "no duplicate logical node");
    let t = topology::poll(&f.bed.access("ha", f.bed.broker_user()), &Default::default()).await;
    let inv = t
        .find(&pair_node)
        .and_then(|n| n.inventory.clone())
        .expect("the promoted backup's inventory");
    assert!(
        inv.queues.contains_key(&name),
        "the queue is on the promoted backup"
    );
}

#[tokio::test]
async fn two_objects_for_one_queue_the_oldest_wins() {
    let _b = brokers_shared().await;
    let f = fixture("q-conflict", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("dup.{id}");
    f.create("first", json!({"name": name})).await;
    f.wait_for("first", "Ready", ready).await;
    f.create("second", json!({"name": name, "filter": "x=1"})).await;
    let second = f
        .wait_for("second", "ResourceConflict", |q| {
            condition(q, "Ready").is_some_and(|c| c.1 == "ResourceConflict")
        })
        .await;
    let (_, _, message) = condition(&second, "Ready").expect("Ready");
    assert!(message.contains(&format!("{}/first", f.ns)), "{message}");
    // The loser wrote nothing: the queue keeps no filter.
    let t = f.topology().await;
    assert!(t.nodes.iter().all(|n| {
        n.inventory
            .as_ref()
            .and_then(|i| i.queues.get(&name))
            .is_some_and(|q| q.filter.is_none())
    }));
    // Deleting the loser leaves the broker alone (its delete would target the winner's queue).
    f.queues()
        .delete("second", &DeleteParams::default())
        .await
        .expect("delete loser");
    f.wait_gone("second").await;
    let t = f.topology().await;
    assert!(
        t.nodes
            .iter()
            .all(|n| n.inventory.as_ref().is_some_and(|i| i.queues.contains_key(&name)))
    );
}

#[tokio::test]
async fn a_paused_object_makes_no_broker_writes() {
    let _b = brokers_shared().await;
    let f = fixture("q-paused", None).await;
    let id = short_id();
    f.clean.also(&id);
    let name = format!("paused.{id}");
    let q: ArtemisQueue = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisQueue",
        "metadata": {"name": name, "annotations": {"artemis-studio.io/paused": "true"}},
        "spec": {"clusterRef": {"name": "c"}}
    }))
    .expect("queue json");
    f.queues()
        .create(&PostParams::default(), &q)
        .await
        .expect("create");
    let q = f
        .wait_for(&name, "Paused", |q| {
            condition(q, "Paused").is_some_and(|c| c.0 == "True")
        })
        .await;
    assert!(all(&q, Outcome::WouldApply), "{:?}", outcomes(&q));
    assert!(f.audit_rows("queue.").await.is_empty());
    f.queues()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"artemis-studio.io/paused": null}}})),
        )
        .await
        .expect("unpause");
    f.wait_for(&name, "Ready once unpaused", ready).await;
    assert_eq!(f.audit_rows("queue.").await.len(), 1, "one command once unpaused");
}
