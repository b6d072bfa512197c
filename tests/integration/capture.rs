//! Capture, part 1 (ADR-0062, ADR-0066) on the real test bed: taps installed, healed and swept by
//! one reconciler per cluster. Every test starts from state that already exists on the brokers
//! (queues made behind the operator's back), and proves "nothing happened" from later passes
//! recorded in `capture_pass`, never from a sleep.

use std::time::Duration;

use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use artemis_studio_operator::api::RefusalKind;
use artemis_studio_operator::api::capture::{ArtemisCaptureSubscription, TapState};
use artemis_studio_operator::api::capture_names::TapName;

use crate::queue::{Fixture, fixture};
use crate::support::{Broker, TestBed, brokers_shared, jolokia_raw, short_id, wait_until, wait_until_or_say};

const ORIGIN: Option<&str> = Some("http://localhost");

/// One management exec on a broker as the admin user; the value (or the error document).
pub async fn exec(bed: &TestBed, broker: &Broker, operation: &str, arguments: Value) -> Value {
    let (_, body) = jolokia_raw(
        broker,
        &bed.broker_user(),
        ORIGIN,
        json!({"type": "exec", "mbean": format!("org.apache.activemq.artemis:broker=\"{}\"", broker.name),
               "operation": operation, "arguments": arguments}),
    )
    .await;
    body
}

/// A queue made on every node of cluster c behind the operator's back.
pub async fn broker_queue(bed: &TestBed, address: &str) {
    for b in bed.cluster_brokers("c") {
        let doc = json!({"name": address, "address": address, "routing-type": "ANYCAST", "durable": true})
            .to_string();
        let r = exec(
            bed,
            &b,
            "createQueue(java.lang.String,boolean)",
            json!([doc, true]),
        )
        .await;
        assert_eq!(r["status"], 200, "create {address} on {}: {r}", b.name);
    }
}

pub async fn divert_names(bed: &TestBed, broker: &Broker) -> Vec<String> {
    let (_, body) = jolokia_raw(
        broker,
        &bed.broker_user(),
        ORIGIN,
        json!({"type": "read", "mbean": format!("org.apache.activemq.artemis:broker=\"{}\"", broker.name), "attribute": "DivertNames"}),
    )
    .await;
    body["value"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// A capture queue's counter summed over cluster c's nodes (the cluster load-balances copies
/// over every node's capture queue).
async fn total_on_cluster_c(bed: &TestBed, queue: &str, attribute: &str) -> i64 {
    let mut n = 0;
    for b in bed.cluster_brokers("c") {
        n += queue_attr(bed, &b, queue, attribute).await.as_i64().unwrap_or(0);
    }
    n
}

pub async fn queue_attr(bed: &TestBed, broker: &Broker, queue: &str, attribute: &str) -> Value {
    let (_, body) = jolokia_raw(
        broker,
        &bed.broker_user(),
        ORIGIN,
        json!({"type": "read", "mbean": format!(
            "org.apache.activemq.artemis:broker=\"{}\",component=addresses,address=\"{queue}\",subcomponent=queues,routing-type=\"anycast\",queue=\"{queue}\"", broker.name),
            "attribute": attribute}),
    )
    .await;
    body["value"].clone()
}

async fn json_of(bed: &TestBed, broker: &Broker, operation: &str, arg: &str) -> Value {
    let r = exec(bed, broker, operation, json!([arg])).await;
    serde_json::from_str(r["value"].as_str().unwrap_or("null")).unwrap_or(Value::Null)
}

impl Fixture {
    pub fn subscriptions(&self) -> Api<ArtemisCaptureSubscription> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// A subscription as automation makes one: it accepts the blast radius without review
    /// (the annotation, recorded in the audit rows). The preview-then-arm flow a person follows
    /// is `subscribe_for_review`.
    pub async fn subscribe(&self, name: &str, spec: Value) {
        self.create_subscription(name, spec, true).await
    }

    /// A subscription with no annotation: it installs nothing until armed (or it names one queue).
    pub async fn subscribe_for_review(&self, name: &str, spec: Value) {
        self.create_subscription(name, spec, false).await
    }

    async fn create_subscription(&self, name: &str, spec: Value, without_review: bool) {
        let mut spec = spec;
        if spec.get("clusterRef").is_none() {
            spec["clusterRef"] = json!({"name": "c"});
        }
        let annotations = if without_review {
            json!({"artemis-studio.io/confirm-without-review": "true"})
        } else {
            json!({})
        };
        let s: ArtemisCaptureSubscription = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
            "metadata": {"name": name, "annotations": annotations}, "spec": spec
        }))
        .expect("subscription json");
        self.subscriptions()
            .create(&PostParams::default(), &s)
            .await
            .expect("create ArtemisCaptureSubscription");
    }

    pub async fn wait_subscription(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ArtemisCaptureSubscription) -> bool,
    ) -> ArtemisCaptureSubscription {
        let api = self.subscriptions();
        let check = &check;
        wait_until(
            &format!("subscription {name}: {what}"),
            Duration::from_secs(90),
            || {
                let api = api.clone();
                async move { api.get(name).await.ok().filter(|s| check(s)) }
            },
        )
        .await
    }

    /// Wait until the subscription is gone (its finalizer released once its taps are swept).
    /// On timeout it says what the subscription shows and what the cluster's last passes did.
    pub async fn wait_subscription_gone(&self, name: &str) {
        let api = self.subscriptions();
        wait_until_or_say(
            &format!("subscription {name} is gone"),
            Duration::from_secs(120),
            || {
                let api = api.clone();
                async move { api.get_opt(name).await.ok().flatten().is_none().then_some(()) }
            },
            || self.why_still_there(name),
        )
        .await;
    }

    /// A deleted subscription still there: its finalizers and conditions, its open tap records,
    /// and the cluster's last passes (result, commands, deferred).
    async fn why_still_there(&self, name: &str) -> String {
        let s = self.subscriptions().get_opt(name).await.ok().flatten();
        let (finalizers, conditions) = s.map_or_else(Default::default, |s| {
            let conditions: Vec<String> = s
                .status
                .map(|st| {
                    st.conditions
                        .iter()
                        .map(|c| format!("{}={}: {}", c.type_, c.status, c.message))
                        .collect()
                })
                .unwrap_or_default();
            (s.metadata.finalizers.unwrap_or_default(), conditions)
        });
        let pool = self.op.store.pool();
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM capture_tap WHERE subscription = $1 AND removed_at IS NULL AND cluster LIKE $2",
        )
        .bind(name)
        .bind(format!("{}/%", self.ns))
        .fetch_one(pool)
        .await
        .unwrap_or(-1);
        let passes: Vec<(String, i32, i32)> = sqlx::query_as(
            "SELECT result, commands, deferred FROM capture_pass WHERE cluster LIKE $1 ORDER BY started_at DESC LIMIT 5",
        )
        .bind(format!("{}/%", self.ns))
        .fetch_all(pool)
        .await
        .unwrap_or_default();
        format!(
            "finalizers {finalizers:?}\nconditions {conditions:#?}\nopen tap records {open}\nlast passes (result, commands, deferred) {passes:#?}"
        )
    }

    /// Passes this operator recorded over the cluster so far.
    pub async fn passes(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM capture_pass WHERE cluster = $1")
            .bind(format!("{}/c", self.ns))
            .fetch_one(self.op.store.pool())
            .await
            .expect("count passes")
    }

    /// Wait until `n` more passes have finished: positive evidence that the reconciler looked.
    pub async fn later_passes(&self, n: i64) {
        let start = self.passes().await;
        wait_until(
            &format!("{n} more capture passes"),
            Duration::from_secs(60 + 10 * n as u64),
            || async move { (self.passes().await >= start + n).then_some(()) },
        )
        .await;
    }

    pub async fn capture_audit_rows(&self, command: &str) -> Vec<(String, Value)> {
        sqlx::query_as::<_, (String, Value)>(
            "SELECT outcome, COALESCE(outcome_detail, '{}'::jsonb) FROM audit_event WHERE command = $1 AND object_namespace = $2 ORDER BY id",
        )
        .bind(command)
        .bind(&self.ns)
        .fetch_all(self.op.store.pool())
        .await
        .expect("audit rows")
    }

    /// Wait until the subscription has `n` captured rows; (original address, source message ID,
    /// node, body) of each.
    pub async fn wait_rows(
        &self,
        subscription: &str,
        n: usize,
    ) -> Vec<(String, Option<String>, String, Option<String>)> {
        let pool = self.op.store.pool().clone();
        let ns = self.ns.clone();
        let rows = wait_until(
            &format!("{n} captured rows of {subscription}"),
            Duration::from_secs(60),
            || {
                let pool = pool.clone();
                let ns = ns.clone();
                async move {
                    let rows: Vec<(String, Option<String>, String, Option<String>)> = sqlx::query_as(
                        "SELECT original_address, source_message_id, node, body_text FROM captured_message \
                     WHERE cluster LIKE $1 AND subscription = $2 ORDER BY captured_at",
                    )
                    .bind(format!("{ns}/%"))
                    .bind(subscription)
                    .fetch_all(&pool)
                    .await
                    .ok()?;
                    (rows.len() >= n).then_some(rows)
                }
            },
        )
        .await;
        assert_eq!(rows.len(), n, "exactly {n} rows: {rows:?}");
        rows
    }

    pub fn tap(&self, address: &str, subscription: &str) -> TapName {
        TapName::new(&self.op.ctx.instance_id, &self.ns, address, subscription)
    }
}

pub fn taps_in(s: &ArtemisCaptureSubscription, state: TapState) -> usize {
    s.status
        .as_ref()
        .map(|st| st.taps.iter().filter(|t| t.state == state).count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_tap_is_installed_on_every_node_a_second_pass_writes_nothing_and_delete_sweeps_it() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-install", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.orders");
    broker_queue(&f.bed, &address).await;
    f.subscribe("orders", json!({"queues": format!("cap.{id}.#"), "ringSize": 50, "expiryDelaySeconds": 120, "maxBufferBytes": 4194304})).await;
    let s = f
        .wait_subscription("orders", "3 taps installed and drained", |s| {
            taps_in(s, TapState::Healthy) == 3
        })
        .await;
    let status = s.status.clone().expect("status");
    assert_eq!(status.instance_id.as_deref(), Some(f.op.ctx.instance_id.as_str()));
    assert_eq!(status.addresses, vec![address.clone()]);
    assert!(
        status.taps.iter().all(|t| t.coverage_start.is_some()),
        "{:?}",
        status.taps
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Draining")
    );
    assert!(
        s.finalizers()
            .iter()
            .any(|x| x == "artemis-studio.io/capture-taps"),
        "the subscription carries the capture finalizer"
    );

    let tap = f.tap(&address, "orders");
    let queue = tap.capture_queue();
    for b in f.bed.cluster_brokers("c") {
        // (4) a non-exclusive divert with its own routing name into the capture address.
        assert!(
            divert_names(&f.bed, &b).await.contains(&tap.divert()),
            "divert on {}",
            b.name
        );
        let (_, ours) = jolokia_raw(
            &b,
            &f.bed.broker_user(),
            ORIGIN,
            json!({"type": "read", "mbean": format!(
                "org.apache.activemq.artemis:broker=\"{}\",component=addresses,address=\"{address}\",subcomponent=diverts,divert=\"{}\"",
                b.name, tap.divert())}),
        )
        .await;
        let ours = &ours["value"];
        assert_eq!(ours["Exclusive"], false, "{ours}");
        // By FQQN: copies go to this node's capture queue, never over the cluster bridge.
        assert_eq!(
            ours["ForwardingAddress"],
            tap.forwarding_address().as_str(),
            "{ours}"
        );
        assert_eq!(ours["RoutingName"], tap.divert().as_str(), "{ours}");
        // (3) a non-durable ring queue.
        assert_eq!(queue_attr(&f.bed, &b, &queue, "Durable").await, json!(false));
        assert_eq!(queue_attr(&f.bed, &b, &queue, "RingSize").await, json!(50));
        // (1) address settings: auto-create/delete addresses only, DROP at a max size, expiry.
        let a = json_of(&f.bed, &b, "getAddressSettingsAsJSON", &queue).await;
        assert_eq!(a["addressFullMessagePolicy"], "DROP", "{a}");
        assert_eq!(a["maxSizeBytes"], 4194304, "{a}");
        assert_eq!(a["autoCreateAddresses"], true, "{a}");
        assert_eq!(a["autoDeleteAddresses"], true, "{a}");
        assert_eq!(a["autoCreateQueues"], false, "{a}");
        assert_eq!(a["autoDeleteQueues"], false, "{a}");
        assert_eq!(a["expiryDelay"], 120000, "{a}");
        // (2) only the operator's role may consume or browse; nobody sends.
        let roles = json_of(&f.bed, &b, "getRolesAsJSON", &queue).await;
        let roles = roles.as_array().cloned().unwrap_or_default();
        assert!(
            roles.iter().all(|r| r["send"] == false
                && (r["name"] == "amq" || (r["consume"] == false && r["browse"] == false))),
            "{roles:?}"
        );
    }
    // Audited installs reached every node exactly once (a node whose poll timed out on this busy
    // machine is installed by a later pass, in its own command).
    let installs = f.capture_audit_rows("capture.install").await;
    assert!(installs.iter().all(|r| r.0 == "succeeded"), "{installs:?}");
    let nodes: usize = installs
        .iter()
        .filter_map(|r| r.1["nodes"].as_array().map(Vec::len))
        .sum();
    assert_eq!(nodes, 3, "{installs:?}");

    // A second (and third) pass changes nothing and writes no audit row.
    f.later_passes(2).await;
    assert_eq!(
        f.capture_audit_rows("capture.install").await.len(),
        installs.len()
    );

    // What producers send to the source address is copied into Postgres; the application's
    // queue keeps every message.
    let c1 = f.bed.broker("c1");
    crate::support::send_messages(&f.bed, "c1", &address, 3).await;
    let rows = f.wait_rows("orders", 3).await;
    assert!(
        rows.iter().all(|r| r.0 == address),
        "original address from the install record: {rows:?}"
    );
    assert_eq!(queue_attr(&f.bed, &c1, &address, "MessageCount").await, json!(3));
    f.wait_subscription("orders", "status counts 3 captured", |s| {
        s.status.as_ref().is_some_and(|st| st.captured == 3)
    })
    .await;

    // Delete: the pass removes every object of the tap, then releases the finalizer.
    f.subscriptions()
        .delete("orders", &DeleteParams::default())
        .await
        .expect("delete subscription");
    let api = f.subscriptions();
    wait_until("the subscription is gone", Duration::from_secs(90), || {
        let api = api.clone();
        async move { api.get_opt("orders").await.ok().flatten().is_none().then_some(()) }
    })
    .await;
    for b in f.bed.cluster_brokers("c") {
        assert!(
            !divert_names(&f.bed, &b).await.contains(&tap.divert()),
            "divert left on {}",
            b.name
        );
        assert_eq!(
            queue_attr(&f.bed, &b, &queue, "Durable").await,
            Value::Null,
            "queue left on {}",
            b.name
        );
        // The application's queue and its messages are untouched.
        assert!(queue_attr(&f.bed, &b, &address, "Durable").await == json!(true));
    }
    assert_eq!(queue_attr(&f.bed, &c1, &address, "MessageCount").await, json!(3));
    let removes = f.capture_audit_rows("capture.remove").await;
    assert_eq!(removes.len(), 1, "{removes:?}");
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM capture_tap WHERE removed_at IS NULL")
        .fetch_one(f.op.store.pool())
        .await
        .expect("open taps");
    assert_eq!(open, 0);
}

#[tokio::test]
async fn an_exclusive_divert_refuses_that_node_and_installs_nothing_there() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-excl", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.excl");
    broker_queue(&f.bed, &address).await;
    // An application's exclusive divert on c2 only, made behind the operator's back.
    let c2 = f.bed.broker("c2");
    let sink = format!("cap.{id}.sink");
    let doc = json!({"name": sink, "address": sink, "routing-type": "ANYCAST"}).to_string();
    exec(
        &f.bed,
        &c2,
        "createQueue(java.lang.String,boolean)",
        json!([doc, true]),
    )
    .await;
    let divert = json!({"name": format!("app-{id}"), "routing-name": format!("app-{id}"), "address": address,
                        "forwarding-address": sink, "exclusive": true, "routing-type": "ANYCAST"})
    .to_string();
    let r = exec(&f.bed, &c2, "createDivert(java.lang.String)", json!([divert])).await;
    assert_eq!(r["status"], 200, "{r}");

    f.subscribe("excl", json!({"queues": address})).await;
    let s = f
        .wait_subscription("excl", "c2 refused, the others installed", |s| {
            taps_in(s, TapState::Refused) == 1 && taps_in(s, TapState::Healthy) == 2
        })
        .await;
    let refused = s
        .status
        .as_ref()
        .and_then(|st| st.taps.iter().find(|t| t.state == TapState::Refused).cloned())
        .expect("refused tap");
    assert_eq!(refused.refusal, Some(RefusalKind::ExclusiveDivertPresent));
    assert!(
        refused
            .message
            .as_deref()
            .unwrap_or("")
            .contains(&format!("app-{id}")),
        "{refused:?}"
    );
    let tap = f.tap(&address, "excl");
    assert!(!divert_names(&f.bed, &c2).await.contains(&tap.divert()));
    assert_eq!(
        queue_attr(&f.bed, &c2, &tap.capture_queue(), "Durable").await,
        Value::Null
    );
    // Nothing was written there later either.
    f.later_passes(2).await;
    assert!(!divert_names(&f.bed, &c2).await.contains(&tap.divert()));
    let installs = f.capture_audit_rows("capture.install").await;
    let nodes: usize = installs
        .iter()
        .filter_map(|r| r.1["nodes"].as_array().map(Vec::len))
        .sum();
    assert_eq!(nodes, 2, "c1 and c3 only: {installs:?}");

    exec(
        &f.bed,
        &c2,
        "destroyDivert(java.lang.String)",
        json!([format!("app-{id}")]),
    )
    .await;
    f.subscriptions()
        .delete("excl", &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test]
async fn a_broker_user_without_security_authority_gets_no_security_authority_and_nothing_installed() {
    let _shared = brokers_shared().await;
    let f = crate::queue::fixture_on("cap-nosec", "c", TestBed::viewer_user, None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.nosec");
    broker_queue(&f.bed, &address).await;
    f.subscribe("nosec", json!({"queues": address})).await;
    let s = f
        .wait_subscription("nosec", "every node refused", |s| {
            taps_in(s, TapState::Refused) == 3
        })
        .await;
    for t in &s.status.as_ref().expect("status").taps {
        assert_eq!(t.refusal, Some(RefusalKind::NoSecurityAuthority), "{t:?}");
        assert!(
            t.message.as_deref().unwrap_or("").contains("addSecuritySettings"),
            "{t:?}"
        );
    }
    let tap = f.tap(&address, "nosec");
    for b in f.bed.cluster_brokers("c") {
        assert!(!divert_names(&f.bed, &b).await.contains(&tap.divert()));
        assert_eq!(
            queue_attr(&f.bed, &b, &tap.capture_queue(), "Durable").await,
            Value::Null
        );
        let a = json_of(&f.bed, &b, "getAddressSettingsAsJSON", &tap.capture_queue()).await;
        assert_ne!(
            a["addressFullMessagePolicy"], "DROP",
            "no address settings were added: {a}"
        );
    }
    assert!(
        f.capture_audit_rows("capture.install").await.is_empty(),
        "no command was sent"
    );
}

/// Objects of a tap made by hand (another installation's, or one to be swept).
async fn hand_made_tap(bed: &TestBed, broker: &Broker, tap: &TapName) {
    let q = tap.capture_queue();
    let doc = json!({"name": q, "address": q, "routing-type": "ANYCAST", "durable": false, "ring-size": 10})
        .to_string();
    let r = exec(
        bed,
        broker,
        "createQueue(java.lang.String,boolean)",
        json!([doc, true]),
    )
    .await;
    assert_eq!(r["status"], 200, "{r}");
    let d = tap.divert();
    let doc = json!({"name": d, "routing-name": d, "address": tap.address, "forwarding-address": q,
                     "exclusive": false, "routing-type": "ANYCAST"})
    .to_string();
    let r = exec(bed, broker, "createDivert(java.lang.String)", json!([doc])).await;
    assert_eq!(r["status"], 200, "{r}");
}

async fn remove_hand_made_tap(bed: &TestBed, broker: &Broker, tap: &TapName) {
    exec(
        bed,
        broker,
        "destroyDivert(java.lang.String)",
        json!([tap.divert()]),
    )
    .await;
    exec(
        bed,
        broker,
        "destroyQueue(java.lang.String,boolean,boolean)",
        json!([tap.capture_queue(), true, true]),
    )
    .await;
}

/// Strip every finalizer and wait until the object is gone (a user forcing a delete).
async fn force_delete(api: &Api<ArtemisCaptureSubscription>, name: &str) {
    api.delete(name, &DeleteParams::default()).await.expect("delete");
    api.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("strip finalizers");
    wait_until("the subscription is gone", Duration::from_secs(30), || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok().flatten().is_none().then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn taps_of_a_subscription_deleted_while_no_operator_ran_are_swept_at_start_and_another_instances_are_never_touched()
 {
    let _shared = brokers_shared().await;
    let f = fixture("cap-orphan", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.orphan");
    broker_queue(&f.bed, &address).await;
    // Another installation's tap on the same address, on every node.
    let foreign = TapName::new(&format!("other-{id}"), "other", &address, "orders");
    for b in f.bed.cluster_brokers("c") {
        hand_made_tap(&f.bed, &b, &foreign).await;
    }
    f.subscribe("orders", json!({"queues": address})).await;
    f.wait_subscription("orders", "3 taps installed", |s| {
        taps_in(s, TapState::Healthy) == 3
    })
    .await;
    let ours = f.tap(&address, "orders");

    // The operator stops; the subscription is force-deleted behind its back.
    let Fixture {
        bed, ns, admin, op, ..
    } = f;
    let (db, instance) = (op.db.clone(), op.ctx.instance_id.clone());
    drop(op);
    let subs: Api<ArtemisCaptureSubscription> = Api::namespaced(admin.clone(), &ns);
    force_delete(&subs, "orders").await;
    for b in bed.cluster_brokers("c") {
        assert!(
            divert_names(&bed, &b).await.contains(&ours.divert()),
            "still there while no operator runs"
        );
    }

    // The same installation starts again: its first passes sweep the orphan, nothing else.
    let op = bed.start_operator_on(&[&ns], &db, &instance).await;
    let f = Fixture {
        bed,
        ns,
        admin,
        op,
        clean: f.clean,
    };
    // Swept from every node (a node that timed out on this busy machine is swept by a later pass).
    let brokers = f.bed.cluster_brokers("c");
    wait_until(
        "the orphan is swept from every node",
        Duration::from_secs(120),
        || async {
            for b in &brokers {
                if divert_names(&f.bed, b).await.contains(&ours.divert()) {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    // The pass records each removal's outcome once its whole sweep (divert, queue, address,
    // settings) is done, so the row may still say `pending` when the divert is already gone.
    wait_until(
        "the removal's audit row says succeeded",
        Duration::from_secs(60),
        || async {
            let removes = f.capture_audit_rows("capture.remove").await;
            removes.iter().any(|r| r.0 == "succeeded").then_some(())
        },
    )
    .await;
    for b in f.bed.cluster_brokers("c") {
        let names = divert_names(&f.bed, &b).await;
        assert!(!names.contains(&ours.divert()), "our orphan swept on {}", b.name);
        assert!(
            names.contains(&foreign.divert()),
            "another instance's divert untouched on {}",
            b.name
        );
        assert_eq!(
            queue_attr(&f.bed, &b, &foreign.capture_queue(), "Durable").await,
            json!(false)
        );
        assert_eq!(
            queue_attr(&f.bed, &b, &ours.capture_queue(), "Durable").await,
            Value::Null
        );
        assert_eq!(
            queue_attr(&f.bed, &b, &address, "Durable").await,
            json!(true),
            "the application's queue stays"
        );
    }
    let reason: String =
        sqlx::query_scalar("SELECT removal_reason FROM capture_tap WHERE subscription = 'orders' LIMIT 1")
            .fetch_one(f.op.store.pool())
            .await
            .expect("removal reason");
    assert!(reason.starts_with("orphan"), "{reason}");
    // Later passes (kept coming by a subscription that matches nothing) still leave the other
    // instance alone.
    f.subscribe("idle", json!({"queues": format!("cap.{id}.nothing-matches")}))
        .await;
    f.later_passes(2).await;
    for b in f.bed.cluster_brokers("c") {
        assert!(divert_names(&f.bed, &b).await.contains(&foreign.divert()));
        remove_hand_made_tap(&f.bed, &b, &foreign).await;
    }
}

#[tokio::test]
async fn a_broker_restart_loses_only_the_ring_queue_and_the_next_pass_recreates_it_with_a_coverage_gap() {
    // The HA cluster's plain node is restarted (cluster c's brokers stay warm for the others).
    let _exclusive = crate::support::brokers_exclusive().await;
    let restore_bed = TestBed::get();
    let _restore = crate::support::RestoreHa(&restore_bed);
    let f = crate::queue::fixture_on("cap-restart", "ha", TestBed::broker_user, None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.restart");
    queue_on(&f.bed, &["ha1", "ha2"], &address).await;
    f.subscribe(
        "restart",
        json!({"clusterRef": {"name": "ha"}, "queues": address}),
    )
    .await;
    let before = f
        .wait_subscription("restart", "2 taps installed", |s| {
            taps_in(s, TapState::Healthy) == 2
        })
        .await;
    let ha2 = f.bed.broker("ha2");
    let node = crate::cluster_core::node_id_of(&f.bed, "ha2").await;
    let start_of = |s: &ArtemisCaptureSubscription| {
        s.status.as_ref().and_then(|st| {
            st.taps
                .iter()
                .find(|t| t.node == node)
                .and_then(|t| t.coverage_start.clone())
        })
    };
    let first_start = start_of(&before).expect("coverage start");

    struct Start<'a>(&'a TestBed);
    impl Drop for Start<'_> {
        fn drop(&mut self) {
            self.0.broker_action("start", "ha2");
        }
    }
    let guard = Start(&f.bed);
    f.bed.broker_action("stop", "ha2");
    f.bed.broker_action("start", "ha2");
    std::mem::forget(guard);
    // The restarted broker kept the divert (and the settings); not the non-durable queue, which
    // the next pass re-creates: a new coverage start, later than the first.
    let after = f
        .wait_subscription("restart", "ha2's tap re-created", |s| {
            start_of(s).is_some_and(|t| t > first_start) && taps_in(s, TapState::Healthy) == 2
        })
        .await;
    assert!(start_of(&after) > Some(first_start.clone()));
    let parts: Vec<String> = sqlx::query_scalar::<_, Value>(
        "SELECT params->'parts'->$1 FROM audit_event WHERE command = 'capture.install' ORDER BY id DESC LIMIT 1",
    )
    .bind(&node)
    .fetch_one(f.op.store.pool())
    .await
    .map(|v| serde_json::from_value(v).unwrap_or_default())
    .expect("parts");
    assert_eq!(
        parts,
        vec!["ring queue".to_string()],
        "only the queue was lost: divert and settings survive a restart"
    );
    assert_eq!(
        queue_attr(
            &f.bed,
            &ha2,
            &f.tap(&address, "restart").capture_queue(),
            "Durable"
        )
        .await,
        json!(false)
    );
    // The install record shows the gap: the first incarnation ended, a second one started.
    let rows: Vec<(Option<String>,)> = sqlx::query_as(
        "SELECT removal_reason FROM capture_tap WHERE node = $1 AND subscription = 'restart' ORDER BY id",
    )
    .bind(&node)
    .fetch_all(f.op.store.pool())
    .await
    .expect("records");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows[0].0.as_deref().unwrap_or("").contains("found gone"),
        "{rows:?}"
    );
    assert_eq!(rows[1].0, None);
    f.subscriptions()
        .delete("restart", &DeleteParams::default())
        .await
        .expect("delete");
}

/// Send `n` messages to an address over a real AMQP 1.0 connection; every one must be accepted.
pub async fn amqp_send(
    bed: &TestBed,
    broker: &str,
    address: &str,
    n: usize,
    tag: &str,
) -> Result<(), String> {
    use fe2o3_amqp::types::messaging::Outcome;
    let mut producer = crate::support::amqp_producer(bed, broker, address, tag).await?;
    let sender = &mut producer.sender;
    for i in 0..n {
        match sender.send(format!("{tag} {i}")).await {
            Ok(Outcome::Accepted(_)) => {}
            Ok(other) => return Err(format!("message {i} not accepted: {other:?}")),
            Err(e) => return Err(format!("message {i}: {e}")),
        }
    }
    producer.close().await;
    Ok(())
}

pub async fn queue_on(bed: &TestBed, brokers: &[&str], address: &str) {
    for name in brokers {
        let b = bed.broker(name);
        let doc = json!({"name": address, "address": address, "routing-type": "ANYCAST", "durable": true})
            .to_string();
        let r = exec(
            bed,
            &b,
            "createQueue(java.lang.String,boolean)",
            json!([doc, true]),
        )
        .await;
        assert_eq!(r["status"], 200, "{r}");
    }
}

fn coverage_of(s: &ArtemisCaptureSubscription, node: &str) -> Option<(TapState, Option<String>)> {
    s.status
        .as_ref()?
        .taps
        .iter()
        .find(|t| t.node == node)
        .map(|t| (t.state, t.coverage_start.clone()))
}

/// ADR-0066's end-to-end proof: the divert replicates, the non-durable ring queue does not; a
/// producer on the promoted backup is never refused, and the next pass rebuilds the tap there.
#[tokio::test]
async fn after_a_failover_the_producer_is_never_refused_and_the_next_pass_rebuilds_the_tap_on_the_promoted_backup()
 {
    let _exclusive = crate::support::brokers_exclusive().await;
    let restore_bed = TestBed::get();
    let _restore = crate::support::RestoreHa(&restore_bed);
    let f = crate::queue::fixture_on("cap-failover", "ha", TestBed::broker_user, None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.proof");
    queue_on(&f.bed, &["ha1", "ha2"], &address).await;
    let pair = crate::cluster_core::node_id_of(&f.bed, "ha1").await;
    f.subscribe("proof", json!({"clusterRef": {"name": "ha"}, "queues": address}))
        .await;
    let tap = f.tap(&address, "proof");
    let queue = tap.capture_queue();
    let before = f
        .wait_subscription("proof", "both taps drained", |s| {
            taps_in(s, TapState::Healthy) == 2
        })
        .await;
    let first_start = coverage_of(&before, &pair)
        .and_then(|(_, c)| c)
        .expect("coverage start");
    amqp_send(&f.bed, "ha1", &address, 10, "before")
        .await
        .expect("the producer sends to the primary");
    // The cluster balances the address's messages over ha1 and ha2: both nodes' taps drain them.
    f.wait_rows("proof", 10).await;

    // No operator runs between the promotion and the next pass: the window stays open.
    let Fixture {
        bed, ns, admin, op, ..
    } = f;
    let (db, instance) = (op.db.clone(), op.ctx.instance_id.clone());
    drop(op);
    bed.broker_action("kill", "ha1");
    let ha1b = bed.broker("ha1b");
    wait_until("the backup is active", Duration::from_secs(120), || {
        let bed = &bed;
        let ha1b = &ha1b;
        async move {
            let (_, v) = jolokia_raw(
                ha1b,
                &bed.broker_user(),
                ORIGIN,
                json!({"type": "read", "mbean": "org.apache.activemq.artemis:broker=\"ha1b\"", "attribute": "Active"}),
            )
            .await;
            (v["value"] == json!(true)).then_some(())
        }
    })
    .await;
    // The promoted backup holds the replicated divert and no capture queue...
    assert!(
        divert_names(&bed, &ha1b).await.contains(&tap.divert()),
        "the divert replicated"
    );
    assert_eq!(
        queue_attr(&bed, &ha1b, &queue, "Durable").await,
        Value::Null,
        "the ring queue did not"
    );
    // ...and a producer there is never refused (ADR-0066 D1).
    amqp_send(&bed, "ha1b", &address, 20, "promoted")
        .await
        .expect("every send to the promoted backup is accepted");

    // The operator returns: its next pass rebuilds the ring queue on the backup (only the queue:
    // the divert and the settings replicated), the drain attaches, and the node's coverage
    // starts at the new tap, not at the subscription.
    let op = bed.start_operator_on(&[&ns], &db, &instance).await;
    let f = Fixture {
        bed,
        ns,
        admin,
        op,
        clean: f.clean,
    };
    f.wait_subscription("proof", "the pair's tap rebuilt and drained", |s| {
        coverage_of(s, &pair)
            .is_some_and(|(st, c)| st == TapState::Healthy && c.as_deref() > Some(first_start.as_str()))
    })
    .await;
    let parts: Vec<String> = sqlx::query_scalar::<_, Value>(
        "SELECT params->'parts'->$1 FROM audit_event WHERE command = 'capture.install' ORDER BY id DESC LIMIT 1",
    )
    .bind(&pair)
    .fetch_one(f.op.store.pool())
    .await
    .map(|v| serde_json::from_value(v).unwrap_or_default())
    .expect("parts");
    assert_eq!(parts, vec!["ring queue".to_string()]);
    assert_eq!(queue_attr(&f.bed, &ha1b, &queue, "RingSize").await, json!(10000));
    amqp_send(&f.bed, "ha1b", &address, 3, "after")
        .await
        .expect("send after the rebuild");
    // Every copy drained is stored once: the 10 before, the 3 after (and whatever of the 20 sent
    // in the window reached a capture queue), never twice.
    let pool = f.op.store.pool().clone();
    let bodies: Vec<String> = wait_until("the 3 sent after the rebuild are captured", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            let b: Vec<String> = sqlx::query_scalar(
                "SELECT body_text FROM captured_message WHERE subscription = 'proof' AND body_text IS NOT NULL",
            )
            .fetch_all(&pool)
            .await
            .ok()?;
            (b.iter().filter(|x| x.starts_with("after")).count() == 3).then_some(b)
        }
    })
    .await;
    let mut unique = bodies.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), bodies.len(), "no copy stored twice: {bodies:?}");
    assert_eq!(bodies.iter().filter(|b| b.starts_with("before")).count(), 10);
    // The window's loss, estimated from the source side (no broker counter records it): never
    // below what was really lost there, never above what was sent there.
    let in_window_captured = bodies.iter().filter(|b| b.starts_with("promoted")).count() as i64;
    let estimated: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(messages), 0)::bigint FROM capture_loss WHERE node = $1 AND subscription = 'proof' AND cause = 'failover_window'",
    )
    .bind(&pair)
    .fetch_one(f.op.store.pool())
    .await
    .expect("loss");
    assert!(
        estimated >= 20 - in_window_captured && estimated <= 20,
        "window estimate {estimated}; 20 sent in the window, {in_window_captured} of them captured elsewhere"
    );
    // A gap between the primary's coverage and the backup's.
    let sessions: Vec<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT started_at, confirmed_until FROM capture_coverage_confirmed WHERE node = $1 AND subscription = 'proof' ORDER BY started_at",
    )
    .bind(&pair)
    .fetch_all(f.op.store.pool())
    .await
    .expect("coverage");
    assert!(sessions.len() >= 2, "{sessions:?}");
    assert!(
        sessions[sessions.len() - 1].0 > sessions[0].1,
        "the window is a gap: {sessions:?}"
    );
    let records: Vec<(Option<String>,)> =
        sqlx::query_as("SELECT removal_reason FROM capture_tap WHERE node = $1 ORDER BY id")
            .bind(&pair)
            .fetch_all(f.op.store.pool())
            .await
            .expect("records");
    assert_eq!(
        records.len(),
        2,
        "two incarnations on the pair's node: {records:?}"
    );
    assert!(
        records[0].0.as_deref().unwrap_or("").contains("failover"),
        "{records:?}"
    );
    // Leave nothing behind for the restore: the subscription's taps go with it.
    f.subscriptions()
        .delete("proof", &DeleteParams::default())
        .await
        .expect("delete");
    let api = f.subscriptions();
    wait_until("the subscription is gone", Duration::from_secs(90), || {
        let api = api.clone();
        async move { api.get_opt("proof").await.ok().flatten().is_none().then_some(()) }
    })
    .await;
}

#[tokio::test]
async fn two_processes_of_one_installation_never_overlap_a_pass_and_serve_different_clusters() {
    let _shared = brokers_shared().await;
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("cap-two").await;
    let db = bed.fresh_database().await;
    let instance = format!("test-{}", short_id());
    let id = short_id();
    // Before both processes (`b` outlives the fixture), so neither runs when the sweep does.
    let _clean = bed.clean_up(&[&id]);
    let a = bed.start_operator_on(&[&ns], &db, &instance).await;
    let b = bed.start_operator_on(&[&ns], &db, &instance).await;
    let admin = bed.kube_admin().await;
    for cluster in ["c", "ha"] {
        let urls: Vec<String> = bed
            .cluster_brokers(cluster)
            .into_iter()
            .map(|b| b.jolokia)
            .collect();
        let user = (cluster == "c").then(|| bed.broker_user());
        crate::support::create_cluster(&admin, &ns, cluster, &urls, user).await;
    }
    // Both clusters share one credentials Secret name scheme: give "ha" its own.
    {
        use k8s_openapi::api::core::v1::Secret;
        let (u, p) = bed.broker_user();
        let secret: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "ha-credentials"}, "stringData": {"username": u, "password": p}}))
        .expect("secret");
        Api::<Secret>::namespaced(admin.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("ha secret");
    }
    for cluster in ["c", "ha"] {
        crate::support::wait_cluster_condition(&admin, &ns, cluster, "Ready", "True").await;
    }
    let address = format!("cap.{id}.two");
    queue_on(&bed, &["c1", "c2", "c3", "ha1", "ha2"], &address).await;
    // Empty: `_clean` sweeps, once `b` has stopped too.
    let clean = bed.clean_up(&[]);
    let f = Fixture {
        bed,
        ns,
        admin,
        op: a,
        clean,
    };
    f.subscribe("on-c", json!({"clusterRef": {"name": "c"}, "queues": address}))
        .await;
    f.subscribe("on-ha", json!({"clusterRef": {"name": "ha"}, "queues": address}))
        .await;
    f.wait_subscription("on-c", "3 taps", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    f.wait_subscription("on-ha", "2 taps", |s| taps_in(s, TapState::Healthy) == 2)
        .await;

    // Each process takes its share: the clusters end up served by different processes.
    let pool = f.op.store.pool().clone();
    let holders = wait_until("c and ha served by different processes", Duration::from_secs(90), || {
        let pool = pool.clone();
        let ns = f.ns.clone();
        async move {
            let latest: Vec<(String, String)> = sqlx::query_as(
                "SELECT DISTINCT ON (cluster) cluster, holder FROM capture_pass WHERE cluster = ANY($1) ORDER BY cluster, id DESC",
            )
            .bind(vec![format!("{ns}/c"), format!("{ns}/ha")])
            .fetch_all(&pool)
            .await
            .ok()?;
            (latest.len() == 2 && latest[0].1 != latest[1].1).then_some(latest)
        }
    })
    .await;
    let processes = [f.op.ctx.process_id.clone(), b.ctx.process_id.clone()];
    assert!(holders.iter().all(|(_, h)| processes.contains(h)), "{holders:?}");
    f.later_passes(2).await;
    // The lock: no two passes over one cluster ever overlapped in time.
    let overlapping: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM capture_pass p JOIN capture_pass q ON p.cluster = q.cluster AND p.id < q.id \
         AND p.started_at < q.finished_at AND q.started_at < p.finished_at",
    )
    .fetch_one(&pool)
    .await
    .expect("overlaps");
    assert_eq!(overlapping, 0, "passes of one cluster overlapped");
    // Exactly one install per tap and node, whichever process made it.
    let installs = f.capture_audit_rows("capture.install").await;
    let nodes: usize = installs
        .iter()
        .filter_map(|r| r.1["nodes"].as_array().map(Vec::len))
        .sum();
    assert_eq!(
        nodes, 5,
        "3 nodes of c + 2 of ha, each installed once: {installs:?}"
    );
    for s in ["on-c", "on-ha"] {
        f.subscriptions()
            .delete(s, &DeleteParams::default())
            .await
            .expect("delete");
    }
    let api = f.subscriptions();
    wait_until("both subscriptions gone", Duration::from_secs(90), || {
        let api = api.clone();
        async move {
            let left = api.list(&Default::default()).await.ok()?;
            left.items.is_empty().then_some(())
        }
    })
    .await;
    drop(b);
}

/// The Artemis CLI `producer` (a real Core JMS client) sends `n` text messages to an anycast
/// address.
fn core_produce(bed: &TestBed, broker: &str, address: &str, n: usize) {
    let home = bed.var("TESTBED_ARTEMIS_HOME");
    let (u, p) = bed.broker_user();
    let core = bed.var(&format!("TESTBED_{}_CORE", broker.to_uppercase()));
    let out = std::process::Command::new(format!("{home}/bin/artemis"))
        .args([
            "producer",
            "--url",
            &core,
            "--user",
            &u,
            "--password",
            &p,
            "--destination",
            &format!("queue://{address}"),
            "--message-count",
            &n.to_string(),
            "--message-size",
            "64",
            "--silent",
        ])
        .output()
        .expect("run the Artemis CLI producer");
    assert!(
        out.status.success(),
        "artemis producer: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn amqp_and_core_producers_are_stored_exactly_once_with_their_source_ids_and_truncated_bodies() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-store", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.store");
    broker_queue(&f.bed, &address).await;
    f.subscribe("store", json!({"queues": address, "maxBodyBytes": 6}))
        .await;
    f.wait_subscription("store", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    amqp_send(&f.bed, "c1", &address, 5, "amqp-message")
        .await
        .expect("AMQP producer");
    core_produce(&f.bed, "c1", &address, 5);
    let rows = f.wait_rows("store", 10).await;
    assert!(rows.iter().all(|r| r.0 == address), "{rows:?}");
    // Every copy stays on the node where the divert fired (the divert forwards by FQQN): the
    // cluster never load-balances copies to the other nodes' capture queues.
    let c1 = crate::cluster_core::node_id_of(&f.bed, "c1").await;
    assert!(
        rows.iter().all(|r| r.2 == c1),
        "every row drained on c1 ({c1}): {rows:?}"
    );
    let mut sources: Vec<&str> = rows.iter().filter_map(|r| r.1.as_deref()).collect();
    assert_eq!(
        sources.len(),
        10,
        "every copy carries its source message ID (AMQP and Core): {rows:?}"
    );
    sources.sort();
    sources.dedup();
    assert_eq!(sources.len(), 10);
    // Bodies are cut at maxBodyBytes, and say so with the original size.
    let cut: Vec<(Option<String>, i32, bool)> = sqlx::query_as(
        "SELECT body_text, body_size, body_truncated FROM captured_message WHERE subscription = 'store' AND body_text LIKE 'amqp%'",
    )
    .fetch_all(f.op.store.pool())
    .await
    .expect("bodies");
    assert_eq!(cut.len(), 5, "{cut:?}");
    assert!(
        cut.iter().all(|(t, size, truncated)| *truncated
            && t.as_deref().is_some_and(|t| t.len() <= 6)
            && *size > 6),
        "{cut:?}"
    );
    // No second row for any of them after later passes (and drains) ran.
    f.later_passes(2).await;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = 'store'")
        .fetch_one(f.op.store.pool())
        .await
        .expect("count");
    assert_eq!(n, 10);
    f.subscriptions()
        .delete("store", &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test]
async fn a_firehose_hits_its_rate_cap_and_reports_the_drops_while_a_quiet_subscription_keeps_everything() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-rate", None).await;
    let id = short_id();
    f.clean.also(&id);
    let (hot, calm) = (format!("cap.{id}.hot"), format!("cap.{id}.calm"));
    broker_queue(&f.bed, &hot).await;
    broker_queue(&f.bed, &calm).await;
    f.subscribe("fire", json!({"queues": hot, "maxIngestPerSecond": 1}))
        .await;
    f.subscribe("quiet", json!({"queues": calm})).await;
    for s in ["fire", "quiet"] {
        f.wait_subscription(s, "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
            .await;
    }
    crate::support::send_messages(&f.bed, "c1", &hot, 30).await;
    crate::support::send_messages(&f.bed, "c1", &calm, 5).await;
    f.wait_rows("quiet", 5).await;
    // Stored + dropped by the rate cap = sent: every drop is counted, none is silent.
    let pool = f.op.store.pool().clone();
    let (stored, capped) = wait_until("fire's 30 copies stored or counted", Duration::from_secs(60), || {
        let pool = pool.clone();
        async move {
            let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = 'fire'")
                .fetch_one(&pool)
                .await
                .ok()?;
            let capped: i64 = sqlx::query_scalar(
                "SELECT COALESCE(sum(messages), 0)::bigint FROM capture_loss WHERE subscription = 'fire' AND cause = 'rate_cap'",
            )
            .fetch_one(&pool)
            .await
            .ok()?;
            (stored + capped == 30).then_some((stored, capped))
        }
    })
    .await;
    assert!(
        capped > 0 && stored < 30,
        "the cap bit: stored {stored}, dropped {capped}"
    );
    // Status (written by a later pass) says the same: what was stored, and at least the
    // rate-cap drops as estimated loss.
    f.wait_subscription("fire", "status reports what was stored and dropped", |s| {
        s.status
            .as_ref()
            .is_some_and(|st| st.captured == stored as u64 && st.dropped_estimate >= capped as u64)
    })
    .await;
    // And /metrics: the drops by cause, the stored copies, per subscription.
    let text = f.op.ctx.metrics.encode_text();
    let sample = |needle: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(needle))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let cluster = format!("{}/c", f.ns);
    assert_eq!(
        sample(&format!(
            "artemis_studio_capture_dropped_total{{cluster=\"{cluster}\",subscription=\"fire\",cause=\"rate_cap\"}}"
        )),
        capped as f64,
        "{text}"
    );
    assert_eq!(
        sample(&format!(
            "artemis_studio_capture_stored_total{{cluster=\"{cluster}\",subscription=\"quiet\"}}"
        )),
        5.0
    );
    for s in ["fire", "quiet"] {
        f.subscriptions()
            .delete(s, &DeleteParams::default())
            .await
            .expect("delete");
    }
}

#[tokio::test]
async fn retention_drops_whole_day_partitions_older_than_the_max_age() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-retain", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.retain");
    broker_queue(&f.bed, &address).await;
    f.subscribe(
        "retain",
        json!({"queues": address, "retention": {"maxAgeHours": 24}}),
    )
    .await;
    f.wait_subscription("retain", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    crate::support::send_messages(&f.bed, "c1", &address, 1).await;
    f.wait_rows("retain", 1).await;
    // A day partition from ten days ago, with a row in it.
    let old = old_day_partition(&f, "retain", &address, 10).await;
    // Retention runs every tenth pass (20 s here): wait for the partition to go.
    wait_until(
        "the old day partition is dropped whole",
        Duration::from_secs(120),
        || async {
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $1)")
                    .bind(&old)
                    .fetch_one(f.op.store.pool())
                    .await
                    .expect("exists");
            (!exists).then_some(())
        },
    )
    .await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = 'retain'")
        .fetch_one(f.op.store.pool())
        .await
        .expect("rows");
    assert_eq!(left, 1, "today's row is kept");
    f.subscriptions()
        .delete("retain", &DeleteParams::default())
        .await
        .expect("delete");
}

/// ADR-0062 D4/D9: a SIGKILL between a batch's commit and its settle. The broker gives the
/// unsettled copies back; the next drain stores no second row of any of them, and settles them.
#[tokio::test]
async fn a_batch_redelivered_after_a_sigkill_between_commit_and_settle_makes_no_second_row() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-redeliver", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.redeliver");
    broker_queue(&f.bed, &address).await;
    f.subscribe("orders", json!({"queues": address})).await;
    f.wait_subscription("orders", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    let tap = f.tap(&address, "orders");

    // The same installation, now as a real process that stops between commit and settle.
    let Fixture {
        bed, ns, admin, op, ..
    } = f;
    let (db, instance) = (op.db.clone(), op.ctx.instance_id.clone());
    drop(op);
    let marker = std::env::temp_dir().join(format!("committed-{}", short_id()));
    let marker_path = marker.to_string_lossy().to_string();
    let port = 20_200 + (std::process::id() % 200) as u16;
    let mut first = bed.spawn_operator(
        &ns,
        &db,
        port,
        &[
            ("ARTEMIS_STUDIO_TEST_PAUSE_AFTER_INSERT", marker_path.as_str()),
            ("INSTANCE_ID", instance.as_str()),
            ("CAPTURE_PASS_SECONDS", "2"),
        ],
    );
    crate::support::send_messages(&bed, "c1", &address, 5).await;
    let committed: i64 = wait_until(
        "the process committed a batch and paused before settling it",
        Duration::from_secs(120),
        || {
            let marker = marker.clone();
            async move { std::fs::read_to_string(&marker).ok()?.trim().parse().ok() }
        },
    )
    .await;
    assert!(committed >= 1, "a committed batch: {committed}");
    // The cluster load-balances copies over the nodes' capture queues: counts are summed.
    let queue = tap.capture_queue();
    let sum = |attribute: &'static str| total_on_cluster_c(&bed, &queue, attribute);
    assert_eq!(
        sum("MessagesAcknowledged").await,
        0,
        "nothing settled before the kill"
    );
    first.0.kill().expect("SIGKILL");
    let _ = first.0.wait();
    let _ = std::fs::remove_file(&marker);

    // The next drain gets the copies again (the committed ones too) and settles every one.
    let op = bed.start_operator_on(&[&ns], &db, &instance).await;
    let f = Fixture {
        bed,
        ns,
        admin,
        op,
        clean: f.clean,
    };
    let queue = tap.capture_queue();
    let sum = |attribute: &'static str| total_on_cluster_c(&f.bed, &queue, attribute);
    wait_until(
        "every copy settled by the next drains",
        Duration::from_secs(120),
        || async { (sum("MessagesAcknowledged").await == 5 && sum("MessageCount").await == 0).then_some(()) },
    )
    .await;
    let (rows, sources): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT source_message_id) FROM captured_message WHERE subscription = 'orders' AND cluster = $1",
    )
    .bind(format!("{}/c", f.ns))
    .fetch_one(f.op.store.pool())
    .await
    .expect("rows");
    assert_eq!((rows, sources), (5, 5), "one row per copy, none twice");
    f.subscriptions()
        .delete("orders", &DeleteParams::default())
        .await
        .expect("delete");
}

/// ADR-0062 D9 and Consequences: Postgres stopped under load. The producer is never refused;
/// the ring overwrites; when Postgres returns the drain resumes; the loss reported equals the
/// loss counted on both sides (sent by the producer minus stored rows). Tolerance: 1% (both
/// sides come from exact counts, the slack covers a copy expiring in the ring mid-read).
#[tokio::test]
async fn postgres_stopped_under_load_never_refuses_the_producer_and_reports_the_real_loss() {
    let _shared = brokers_shared().await;
    // This operator keeps its data in a Postgres server of its own, which the test stops (it
    // outlives the operator).
    let pg;
    let mut f = fixture("cap-pgdown", None).await;
    pg = f.bed.scratch_postgres(&format!("pgdown-{}", short_id()));
    f.restart_operator_on(&pg.url).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.pgdown");
    broker_queue(&f.bed, &address).await;
    f.subscribe("orders", json!({"queues": address, "ringSize": 20}))
        .await;
    f.wait_subscription("orders", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    crate::support::send_messages(&f.bed, "c1", &address, 10).await;
    f.wait_rows("orders", 10).await;

    pg.stop();
    // Every send is answered 200 by the broker (asserted per message) while nothing is stored.
    // More than the drains' credit windows (200 per node, held unsettled while the database is
    // away) plus the rings (20 per node) hold: the rings must overwrite.
    let during = 1500;
    crate::support::send_messages(&f.bed, "c1", &address, during).await;
    let sent = 10 + during as i64;
    let tap = f.tap(&address, "orders");
    // The cluster load-balances copies over the nodes' capture queues: counts are summed.
    let queue = tap.capture_queue();
    let sum = |attribute: &'static str| total_on_cluster_c(&f.bed, &queue, attribute);
    // (A copy forwarded to another node's capture queue may still be on its way.)
    wait_until(
        "every copy reached a capture queue",
        Duration::from_secs(30),
        || async { (sum("MessagesAdded").await == sent).then_some(()) },
    )
    .await;
    pg.start();

    // The drains resume, empty the rings, and a later pass reads the counters.
    wait_until(
        "the capture queues are drained after Postgres returned",
        Duration::from_secs(180),
        || async { (sum("MessageCount").await == 0).then_some(()) },
    )
    .await;
    let cluster = format!("{}/c", f.ns);
    let counts = || async {
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM captured_message WHERE cluster = $1 AND subscription = 'orders'",
        )
        .bind(&cluster)
        .fetch_one(f.op.store.pool())
        .await
        .expect("rows");
        let reported: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(messages), 0)::bigint FROM capture_loss WHERE cluster = $1 AND subscription = 'orders'",
        )
        .bind(&cluster)
        .fetch_one(f.op.store.pool())
        .await
        .expect("loss");
        (stored, reported)
    };
    let (stored, _) = wait_until(
        "the loss is reported after the drain resumed",
        Duration::from_secs(120),
        || async {
            let (stored, reported) = counts().await;
            let causes: Vec<(String, String, i64)> = sqlx::query_as(
                "SELECT node, cause, messages FROM capture_loss WHERE subscription = 'orders' ORDER BY node, cause",
            )
            .fetch_all(f.op.store.pool())
            .await
            .unwrap_or_default();
            eprintln!("sent {sent}, stored {stored}, reported lost {reported}: {causes:?}");
            (stored > 10 && reported > 0 && (sent - stored - reported).abs() <= sent / 100)
                .then_some((stored, reported))
        },
    )
    .await;
    assert!(stored < sent, "the ring overwrote: {stored} of {sent} stored");
    // Nothing more arrives later: two more passes, same counts.
    f.later_passes(2).await;
    let (stored_after, reported_after) = counts().await;
    assert_eq!(stored_after, stored);
    assert!(
        (sent - stored_after - reported_after).abs() <= sent / 100,
        "sent {sent}, stored {stored_after}, reported lost {reported_after}"
    );
    f.subscriptions()
        .delete("orders", &DeleteParams::default())
        .await
        .expect("delete");
}

/// A past day partition of a subscription, with one row in it (as if captured `days_ago`).
async fn old_day_partition(f: &Fixture, subscription: &str, address: &str, days_ago: i64) -> String {
    let pool = f.op.store.pool();
    let sub_id: i64 = sqlx::query_scalar("SELECT id FROM capture_subscription WHERE subscription = $1")
        .bind(subscription)
        .fetch_one(pool)
        .await
        .expect("subscription id");
    let day = (chrono::Utc::now() - chrono::Duration::days(days_ago)).date_naive();
    let next = day + chrono::Duration::days(1);
    let name = format!("captured_message_s{sub_id}_{}", day.format("%Y%m%d"));
    sqlx::query(&format!(
        "CREATE TABLE {name} PARTITION OF captured_message_s{sub_id} FOR VALUES FROM ('{day}T00:00:00Z') TO ('{next}T00:00:00Z')"
    ))
    .execute(pool)
    .await
    .expect("old partition");
    sqlx::query(&format!(
        "INSERT INTO captured_message (cluster, subscription, subscription_id, node, original_address, capture_queue, body_size, captured_at) \
         VALUES ('{}/c', '{subscription}', {sub_id}, 'n', '{address}', 'q', 0, '{day}T12:00:00Z')",
        f.ns
    ))
    .execute(pool)
    .await
    .expect("old row");
    name
}

async fn partition_sizes(f: &Fixture, subscription: &str) -> Vec<(String, i64)> {
    sqlx::query_as(
        "SELECT c.relname::text, pg_total_relation_size(c.oid) FROM pg_inherits i \
         JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent \
         JOIN capture_subscription s ON p.relname = 'captured_message_s' || s.id \
         WHERE s.subscription = $1 ORDER BY c.relname",
    )
    .bind(subscription)
    .fetch_all(f.op.store.pool())
    .await
    .expect("partitions")
}

/// Retention by size: the oldest day partitions go, whole, until the rest fits; no more.
#[tokio::test]
async fn retention_by_size_drops_the_oldest_day_partitions_until_the_rest_fits() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-size", None).await;
    let id = short_id();
    f.clean.also(&id);
    let address = format!("cap.{id}.size");
    broker_queue(&f.bed, &address).await;
    f.subscribe(
        "sized",
        json!({"queues": address, "retention": {"maxAgeHours": 720}}),
    )
    .await;
    f.wait_subscription("sized", "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
        .await;
    crate::support::send_messages(&f.bed, "c1", &address, 1).await;
    f.wait_rows("sized", 1).await;
    let five = old_day_partition(&f, "sized", &address, 5).await;
    let three = old_day_partition(&f, "sized", &address, 3).await;
    // Both are within maxAgeHours: a later retention run keeps them.
    f.later_passes(11).await;
    let sizes = partition_sizes(&f, "sized").await;
    assert!(sizes.iter().any(|(n, _)| *n == five) && sizes.iter().any(|(n, _)| *n == three));
    // A limit that dropping the oldest day exactly satisfies.
    let total: i64 = sizes.iter().map(|(_, s)| s).sum();
    let size_of = |name: &str| {
        sizes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
            .unwrap_or(0)
    };
    let (oldest, newer) = (size_of(&five), size_of(&three));
    // Half a partition of slack, so a page more here or there changes nothing.
    let limit = total - oldest + newer / 2;
    f.subscriptions()
        .patch(
            "sized",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"retention": {"maxAgeHours": 720, "maxBytes": limit}}})),
        )
        .await
        .expect("set maxBytes");
    wait_until(
        "the oldest day partition is dropped",
        Duration::from_secs(120),
        || async {
            let sizes = partition_sizes(&f, "sized").await;
            (!sizes.iter().any(|(n, _)| *n == five)).then_some(())
        },
    )
    .await;
    // A later retention run drops nothing more: the rest fits.
    f.later_passes(11).await;
    let names: Vec<String> = partition_sizes(&f, "sized")
        .await
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.contains(&three), "the newer past day is kept: {names:?}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = 'sized'")
        .fetch_one(f.op.store.pool())
        .await
        .expect("rows");
    assert_eq!(left, 2, "today's row and the kept day's row");
    f.subscriptions()
        .delete("sized", &DeleteParams::default())
        .await
        .expect("delete");
}

/// Issue 22 item 2: two ArtemisClusters of one installation on the same brokers, each with its
/// own subscription: neither cluster's pass sweeps the other's taps (tap names carry the
/// subscription, not its cluster); both capture everything, and each sweeps only its own when
/// its subscription goes.
#[tokio::test]
async fn two_clusters_on_the_same_brokers_never_sweep_each_others_taps() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-twoclusters", None).await;
    let urls: Vec<String> = f
        .bed
        .cluster_brokers("c")
        .into_iter()
        .map(|b| b.jolokia)
        .collect();
    crate::support::create_cluster(&f.admin, &f.ns, "again", &urls, Some(f.bed.broker_user())).await;
    crate::support::wait_cluster_condition(&f.admin, &f.ns, "again", "Ready", "True").await;
    let id = short_id();
    f.clean.also(&id);
    let (a, b) = (format!("cap2.{id}.a.in"), format!("cap2.{id}.b.in"));
    broker_queue(&f.bed, &a).await;
    broker_queue(&f.bed, &b).await;
    f.subscribe(
        "on-c",
        json!({"queues": format!("cap2.{id}.a.#"), "ringSize": 50}),
    )
    .await;
    f.subscribe(
        "on-again",
        json!({"clusterRef": {"name": "again"}, "queues": format!("cap2.{id}.b.#"), "ringSize": 50}),
    )
    .await;
    for s in ["on-c", "on-again"] {
        f.wait_subscription(s, "3 taps drained", |s| taps_in(s, TapState::Healthy) == 3)
            .await;
    }
    // Several passes of both clusters later, nothing was removed and both still drain.
    let passes_of = |cluster: String| {
        let pool = f.op.store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM capture_pass WHERE cluster = $1")
                .bind(cluster)
                .fetch_one(&pool)
                .await
                .unwrap_or(0)
        }
    };
    let again = format!("{}/again", f.ns);
    let start = passes_of(again.clone()).await;
    f.later_passes(3).await;
    wait_until(
        "3 more passes of the second cluster",
        Duration::from_secs(90),
        || {
            let again = again.clone();
            async move { (passes_of(again).await >= start + 3).then_some(()) }
        },
    )
    .await;
    assert!(
        f.capture_audit_rows("capture.remove").await.is_empty(),
        "a tap was swept"
    );
    for (address, sub) in [(&a, "on-c"), (&b, "on-again")] {
        let tap = f.tap(address, sub);
        for broker in f.bed.cluster_brokers("c") {
            assert!(
                divert_names(&f.bed, &broker).await.contains(&tap.divert()),
                "{sub} on {}",
                broker.name
            );
        }
    }
    crate::support::send_messages(&f.bed, "c1", &a, 2).await;
    crate::support::send_messages(&f.bed, "c2", &b, 3).await;
    f.wait_rows("on-c", 2).await;
    f.wait_rows("on-again", 3).await;

    // Each subscription's delete sweeps its own taps, and only those.
    for sub in ["on-c", "on-again"] {
        f.subscriptions()
            .delete(sub, &DeleteParams::default())
            .await
            .expect("delete");
        let api = f.subscriptions();
        wait_until(&format!("{sub} is gone"), Duration::from_secs(90), || {
            let api = api.clone();
            async move { api.get_opt(sub).await.ok().flatten().is_none().then_some(()) }
        })
        .await;
    }
    for broker in f.bed.cluster_brokers("c") {
        let names = divert_names(&f.bed, &broker).await;
        assert!(
            !names.contains(&f.tap(&a, "on-c").divert()),
            "left on {}",
            broker.name
        );
        assert!(
            !names.contains(&f.tap(&b, "on-again").divert()),
            "left on {}",
            broker.name
        );
    }
    assert_eq!(f.capture_audit_rows("capture.remove").await.len(), 2);
    for address in [&a, &b] {
        for broker in f.bed.cluster_brokers("c") {
            let _ = exec(
                &f.bed,
                &broker,
                "destroyQueue(java.lang.String)",
                json!([address]),
            )
            .await;
        }
    }
}

/// Issue 50: a subscription naming an ArtemisCluster that does not exist says so (Ready=False
/// `ClusterNotFound`, naming the fix) and is Stalled — never "waiting for its turn" for ever.
#[tokio::test]
async fn a_subscription_naming_a_missing_cluster_says_so_and_is_stalled() {
    let _shared = brokers_shared().await;
    let f = fixture("cap-nocluster", None).await;
    f.subscribe(
        "lost",
        json!({"clusterRef": {"name": "nowhere"}, "queues": "lost.#"}),
    )
    .await;
    let has = |s: &ArtemisCaptureSubscription, type_: &str, status: &str, reason: &str| {
        s.status.as_ref().is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
        })
    };
    let s = f
        .wait_subscription("lost", "Ready=False ClusterNotFound and Stalled", |s| {
            has(s, "Ready", "False", "ClusterNotFound") && has(s, "Stalled", "True", "ClusterNotFound")
        })
        .await;
    let ready = s
        .status
        .and_then(|st| st.conditions.into_iter().find(|c| c.type_ == "Ready"))
        .expect("Ready");
    assert!(
        ready.message.contains("nowhere") && ready.message.contains("spec.clusterRef"),
        "{ready:?}"
    );
    f.subscriptions()
        .delete("lost", &DeleteParams::default())
        .await
        .expect("delete");
}
