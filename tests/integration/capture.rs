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
use artemis_studio_operator::capture::names::TapName;

use crate::queue::{Fixture, fixture};
use crate::support::{Broker, TestBed, brokers_shared, jolokia_raw, short_id, wait_until};

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

    pub async fn subscribe(&self, name: &str, spec: Value) {
        let mut spec = spec;
        if spec.get("clusterRef").is_none() {
            spec["clusterRef"] = json!({"name": "c"});
        }
        let s: ArtemisCaptureSubscription = serde_json::from_value(json!({
            "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
            "metadata": {"name": name}, "spec": spec
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
            Duration::from_secs(60),
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

    pub fn tap(&self, address: &str, subscription: &str) -> TapName {
        TapName::new(&self.op.ctx.instance_id, address, subscription)
    }
}

fn taps_in(s: &ArtemisCaptureSubscription, state: TapState) -> usize {
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
    let address = format!("cap.{id}.orders");
    broker_queue(&f.bed, &address).await;
    f.subscribe("orders", json!({"queues": format!("cap.{id}.#"), "ringSize": 50, "expiryDelaySeconds": 120, "maxBufferBytes": 4194304})).await;
    let s = f
        .wait_subscription("orders", "3 taps installed, not drained", |s| {
            taps_in(s, TapState::Degraded) == 3
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
        ("False", "NotDrained")
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
        assert_eq!(ours["ForwardingAddress"], queue.as_str(), "{ours}");
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

    // Attach a consumer to one node's capture queue: that node's tap is being drained.
    let c1 = f.bed.broker("c1");
    let consumer =
        crate::support::amqp_consumer(&f.bed, "c1", &format!("{queue}::{queue}"), &format!("drain-{id}"))
            .await;
    let s = f
        .wait_subscription("orders", "one tap healthy", |s| {
            taps_in(s, TapState::Healthy) == 1
        })
        .await;
    assert_eq!(taps_in(&s, TapState::Degraded), 2);
    // What producers send to the source address is copied; the application's queue keeps it.
    crate::support::send_messages(&f.bed, "c1", &address, 3).await;
    let mut consumer = consumer;
    for _ in 0..3 {
        let d = tokio::time::timeout(
            Duration::from_secs(20),
            consumer.receiver.recv::<fe2o3_amqp::types::primitives::Value>(),
        )
        .await
        .expect("a captured copy within 20 s")
        .expect("receive");
        consumer.receiver.accept(&d).await.expect("accept");
    }
    assert_eq!(queue_attr(&f.bed, &c1, &address, "MessageCount").await, json!(3));
    drop(consumer);

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
            taps_in(s, TapState::Refused) == 1 && taps_in(s, TapState::Degraded) == 2
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
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("cap-nosec").await;
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    crate::support::create_cluster(&admin, &ns, "c", &urls, Some(bed.viewer_user())).await;
    crate::support::wait_cluster_condition(&admin, &ns, "c", "Ready", "True").await;
    let f = Fixture { bed, ns, admin, op };
    let id = short_id();
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
    let address = format!("cap.{id}.orphan");
    broker_queue(&f.bed, &address).await;
    // Another installation's tap on the same address, on every node.
    let foreign = TapName::new(&format!("other-{id}"), &address, "orders");
    for b in f.bed.cluster_brokers("c") {
        hand_made_tap(&f.bed, &b, &foreign).await;
    }
    f.subscribe("orders", json!({"queues": address})).await;
    f.wait_subscription("orders", "3 taps installed", |s| {
        taps_in(s, TapState::Degraded) == 3
    })
    .await;
    let ours = f.tap(&address, "orders");

    // The operator stops; the subscription is force-deleted behind its back.
    let Fixture { bed, ns, admin, op } = f;
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
    let f = Fixture { bed, ns, admin, op };
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
    let _exclusive = crate::support::brokers_exclusive().await;
    let f = fixture("cap-restart", None).await;
    let id = short_id();
    let address = format!("cap.{id}.restart");
    broker_queue(&f.bed, &address).await;
    f.subscribe("restart", json!({"queues": address})).await;
    let before = f
        .wait_subscription("restart", "3 taps installed", |s| {
            taps_in(s, TapState::Degraded) == 3
        })
        .await;
    let c3 = f.bed.broker("c3");
    let node = crate::cluster_core::node_id_of(&f.bed, "c3").await;
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
            self.0.broker_action("start", "c3");
        }
    }
    let guard = Start(&f.bed);
    f.bed.broker_action("stop", "c3");
    f.bed.broker_action("start", "c3");
    std::mem::forget(guard);
    // The restarted broker kept the divert (and the settings); not the non-durable queue, which
    // the next pass re-creates: a new coverage start, later than the first.
    let after = f
        .wait_subscription("restart", "c3's tap re-created", |s| {
            start_of(s).is_some_and(|t| t > first_start) && taps_in(s, TapState::Degraded) == 3
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
            &c3,
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
async fn amqp_send(bed: &TestBed, broker: &str, address: &str, n: usize, tag: &str) -> Result<(), String> {
    use fe2o3_amqp::types::messaging::Outcome;
    let b = bed.broker(broker);
    let (u, p) = bed.broker_user();
    let url = b.amqp.replace("amqp://", &format!("amqp://{u}:{p}@"));
    let mut connection = fe2o3_amqp::Connection::open(format!("producer-{tag}"), url.as_str())
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut session = fe2o3_amqp::Session::begin(&mut connection)
        .await
        .map_err(|e| format!("session: {e}"))?;
    let mut sender = fe2o3_amqp::Sender::attach(&mut session, format!("tx-{tag}"), address)
        .await
        .map_err(|e| format!("attach: {e}"))?;
    for i in 0..n {
        match sender.send(format!("{tag} {i}")).await {
            Ok(Outcome::Accepted(_)) => {}
            Ok(other) => return Err(format!("message {i} not accepted: {other:?}")),
            Err(e) => return Err(format!("message {i}: {e}")),
        }
    }
    let _ = sender.close().await;
    let _ = session.end().await;
    let _ = connection.close().await;
    Ok(())
}

async fn queue_on(bed: &TestBed, brokers: &[&str], address: &str) {
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
    let bed = TestBed::get();
    let ns = bed.fresh_namespace("cap-failover").await;
    let op = bed.start_operator(&ns).await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("ha").into_iter().map(|b| b.jolokia).collect();
    crate::support::create_cluster(&admin, &ns, "ha", &urls, Some(bed.broker_user())).await;
    crate::support::wait_cluster_condition(&admin, &ns, "ha", "Ready", "True").await;
    let f = Fixture { bed, ns, admin, op };
    let id = short_id();
    let address = format!("cap.{id}.proof");
    queue_on(&f.bed, &["ha1", "ha2"], &address).await;
    let pair = crate::cluster_core::node_id_of(&f.bed, "ha1").await;
    f.subscribe("proof", json!({"clusterRef": {"name": "ha"}, "queues": address}))
        .await;
    let tap = f.tap(&address, "proof");
    let queue = tap.capture_queue();
    f.wait_subscription("proof", "2 taps installed", |s| {
        taps_in(s, TapState::Degraded) == 2
    })
    .await;
    // Drained on the primary: HEALTHY.
    let drain = crate::support::amqp_consumer(
        &f.bed,
        "ha1",
        &format!("{queue}::{queue}"),
        &format!("drain-a-{id}"),
    )
    .await;
    let before = f
        .wait_subscription("proof", "the pair's tap healthy", |s| {
            coverage_of(s, &pair).is_some_and(|(st, _)| st == TapState::Healthy)
        })
        .await;
    let first_start = coverage_of(&before, &pair)
        .and_then(|(_, c)| c)
        .expect("coverage start");
    amqp_send(&f.bed, "ha1", &address, 10, "before")
        .await
        .expect("the producer sends to the primary");
    drop(drain);

    // No operator runs between the promotion and the next pass: the window stays open.
    let Fixture { bed, ns, admin, op } = f;
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

    // The operator returns: its next pass rebuilds the tap on the backup; until a drain attaches
    // it is DEGRADED, and the node's coverage starts at the new tap, not at the subscription.
    let op = bed.start_operator_on(&[&ns], &db, &instance).await;
    let f = Fixture { bed, ns, admin, op };
    let rebuilt = f
        .wait_subscription("proof", "the pair's tap rebuilt, not drained", |s| {
            coverage_of(s, &pair)
                .is_some_and(|(st, c)| st == TapState::Degraded && c.as_deref() > Some(first_start.as_str()))
        })
        .await;
    let ready = rebuilt
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded").cloned())
        .expect("Degraded condition");
    assert_eq!(ready.status, "True");
    assert_eq!(queue_attr(&f.bed, &ha1b, &queue, "RingSize").await, json!(10000));
    let mut drain = crate::support::amqp_consumer(
        &f.bed,
        "ha1b",
        &format!("{queue}::{queue}"),
        &format!("drain-b-{id}"),
    )
    .await;
    f.wait_subscription("proof", "the pair's tap healthy again", |s| {
        coverage_of(s, &pair).is_some_and(|(st, _)| st == TapState::Healthy)
    })
    .await;
    amqp_send(&f.bed, "ha1b", &address, 3, "after")
        .await
        .expect("send after the rebuild");
    for _ in 0..3 {
        let d = tokio::time::timeout(
            Duration::from_secs(20),
            drain.receiver.recv::<fe2o3_amqp::types::primitives::Value>(),
        )
        .await
        .expect("a captured copy on the backup within 20 s")
        .expect("receive");
        drain.receiver.accept(&d).await.expect("accept");
    }
    drop(drain);
    let rows: Vec<(Option<String>,)> =
        sqlx::query_as("SELECT removal_reason FROM capture_tap WHERE node = $1 ORDER BY id")
            .bind(&pair)
            .fetch_all(f.op.store.pool())
            .await
            .expect("records");
    assert_eq!(rows.len(), 2, "two incarnations on the pair's node: {rows:?}");
    assert!(
        rows[0].0.as_deref().unwrap_or("").contains("failover"),
        "{rows:?}"
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
    let id = short_id();
    let address = format!("cap.{id}.two");
    queue_on(&bed, &["c1", "c2", "c3", "ha1", "ha2"], &address).await;
    let f = Fixture {
        bed,
        ns,
        admin,
        op: a,
    };
    f.subscribe("on-c", json!({"clusterRef": {"name": "c"}, "queues": address}))
        .await;
    f.subscribe("on-ha", json!({"clusterRef": {"name": "ha"}, "queues": address}))
        .await;
    f.wait_subscription("on-c", "3 taps", |s| taps_in(s, TapState::Degraded) == 3)
        .await;
    f.wait_subscription("on-ha", "2 taps", |s| taps_in(s, TapState::Degraded) == 2)
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
