//! Scenario 3, capture, on cluster "c" (issue 16):
//! (a) one producer's throughput (1 KiB durable AMQP messages, each awaited) to an address with
//!     a tap ÷ to one with the broker's own divert into a local ring, in interleaved rounds of the
//!     same run (../shared/design/OPERATOR.md); target ≥ 0.95;
//! (b) ingest: the operator's drain into Postgres vs. a bare AMQP consumer that discards (manual
//!     credit in batches of 200, accept per batch — the drain minus the database), each over a
//!     ring preloaded with the same copies (the operator is SIGSTOPped while they are produced);
//!     target ≥ 0.8;
//! (c) loss reported vs. actual when the ring bites (ring of 100, the drain paused meanwhile):
//!     actual = sent − stored, reported = the sum of `capture_loss`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::{Body, Header, Message, Outcome};
use fe2o3_amqp::types::primitives::Value as AmqpValue;
use fe2o3_amqp::{Connection, Receiver, Sender, Session};
use serde_json::json;

use crate::cpu::Accounts;
use crate::install::{Ctx, Install};
use crate::jolokia::{Node, Op};
use crate::operator::Operator;
use crate::report::{Headline, Section, Table};
use crate::stats::{Summary, show};

/// One variant's producer rounds: their rates, and the CPU seconds each process group used
/// during them (summed over the rounds; see `cpu`).
#[derive(Default)]
struct Rounds {
    rates: Vec<f64>,
    cpu: BTreeMap<String, f64>,
}

struct Measured {
    messages: usize,
    produce_bare: Rounds,
    /// A divert of the harness's own on c1 into a local ring (no drain, no cluster forwarding),
    /// from a second source, in rounds interleaved with `produce_bare`'s.
    produce_local_divert_alone: Rounds,
    /// The same, in rounds interleaved with `produce_tapped`'s: the headline's baseline.
    produce_local_divert: Rounds,
    /// The same divert, and its ring address also on c2 with a consumer attached there: the
    /// cluster forwards copies to c2 (a remote binding), as it did for a tap before the tap's
    /// divert forwarded by FQQN.
    produce_forwarded_divert: Rounds,
    produce_tapped: Rounds,
    /// The operator's tap with the operator SIGSTOPped (no drain or Postgres work meanwhile).
    produce_tapped_stopped: Rounds,
    ingest_messages: usize,
    ingest_drain: f64,
    ingest_bare: f64,
    loss_sent: i64,
    loss_stored: i64,
    loss_reported: i64,
}

pub async fn run(ctx: &Ctx) -> Result<Section> {
    let install = Install::up(ctx, "capture", &[("CAPTURE_PASS_SECONDS", "2")]).await?;
    let result = measure(ctx, &install).await;
    // The taps go with their subscriptions (the operator sweeps them), then the rest.
    let _ = install
        .objects
        .delete_subscriptions(Duration::from_secs(120))
        .await;
    install.down(ctx).await;
    Ok(section(&result?))
}

fn amqp_url(ctx: &Ctx, broker: &str) -> Result<String> {
    let (u, p) = ctx.bed.broker_user()?;
    let url = ctx.bed.var(&format!("TESTBED_{}_AMQP", broker.to_uppercase()))?;
    Ok(url.replacen("amqp://", &format!("amqp://{u}:{p}@"), 1))
}

/// One producer sends `n` durable 1 KiB messages, each awaited; messages per second.
async fn produce(url: &str, address: &str, n: usize) -> Result<f64> {
    let mut connection = Connection::open(format!("bench-producer-{}", uuid::Uuid::new_v4().simple()), url)
        .await
        .context("AMQP connect")?;
    let mut session = Session::begin(&mut connection).await?;
    let mut sender = Sender::attach(&mut session, "bench-tx", address).await?;
    let body = "x".repeat(1024);
    let start = Instant::now();
    for i in 0..n {
        let message = Message::builder()
            .header(Header {
                durable: true,
                ..Default::default()
            })
            .value(body.clone())
            .build();
        match sender.send(message).await {
            Ok(Outcome::Accepted(_)) => {}
            Ok(other) => bail!("message {i} not accepted: {other:?}"),
            Err(e) => bail!("message {i}: {e}"),
        }
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = sender.close().await;
    let _ = session.end().await;
    let _ = connection.close().await;
    Ok(rate)
}

/// The MBean of the anycast queue `queue` on its own address, on `node`.
fn queue_mbean(node: &Node, queue: &str) -> String {
    format!(
        "{},component=addresses,address=\"{queue}\",subcomponent=queues,routing-type=\"anycast\",queue=\"{queue}\"",
        node.mbean
    )
}

/// Every round starts from an empty source queue on c1: without this, the unconsumed messages of
/// the earlier rounds piled up (2,000 more per round) and each later variant ran against a deeper
/// queue than the baseline before it.
async fn purge(ctx: &Ctx, c1: &Node, queue: &str) -> Result<()> {
    let purge = json!({"type": "exec", "mbean": queue_mbean(c1, queue), "operation": "removeAllMessages()", "arguments": []});
    ctx.jolokia.post(c1, &purge).await?;
    Ok(())
}

/// One kind of producer round: the queue on c1 it sends to, whether the operator is SIGSTOPped
/// during it, and the tap's subscription on that queue if it has one.
struct Variant<'a> {
    source: &'a str,
    stopped: Option<&'a Operator>,
    tap: Option<(&'a sqlx::PgPool, &'a str)>,
}

impl<'a> Variant<'a> {
    fn to(source: &'a str) -> Self {
        Variant {
            source,
            stopped: None,
            tap: None,
        }
    }

    fn tapped(self, pool: &'a sqlx::PgPool, subscription: &'a str) -> Self {
        Variant {
            tap: Some((pool, subscription)),
            ..self
        }
    }

    fn stopped(self, operator: &'a Operator) -> Self {
        Variant {
            stopped: Some(operator),
            ..self
        }
    }
}

/// `repeats` producer rounds of each variant, interleaved (one of each, then again), so that the
/// bed's drift (other processes, the JIT, the disk) falls on every variant alike. Each round starts
/// from an empty source queue on c1.
async fn interleaved(ctx: &Ctx, shape: &Shape<'_>, variants: &[Variant<'_>]) -> Result<Vec<Rounds>> {
    let mut out: Vec<Rounds> = variants.iter().map(|_| Rounds::default()).collect();
    for _ in 0..ctx.cfg.capture_repeats {
        for (variant, rounds) in variants.iter().zip(out.iter_mut()) {
            round(ctx, shape, variant, rounds).await?;
        }
    }
    Ok(out)
}

/// One round. With a tap, the round ends when the drain has stored its copies: a running drain's
/// catching up counts in the round's CPU (and never spills into the next round's), a stopped
/// one's is outside it.
async fn round(ctx: &Ctx, shape: &Shape<'_>, variant: &Variant<'_>, out: &mut Rounds) -> Result<()> {
    purge(ctx, shape.c1, variant.source).await?;
    let stored_before = match variant.tap {
        Some((pool, subscription)) => stored(pool, subscription).await?,
        None => 0,
    };
    let wait_stored = || async {
        match variant.tap {
            Some((pool, subscription)) => {
                drained(pool, subscription, stored_before + shape.messages as i64).await
            }
            None => Ok(()),
        }
    };
    if let Some(op) = variant.stopped {
        op.signal("STOP")?;
    }
    let before = shape.cpu.snapshot();
    let rate = produce(shape.url, variant.source, shape.messages).await;
    if variant.stopped.is_none() {
        wait_stored().await?;
    }
    let spent = before.until(&shape.cpu.snapshot());
    if let Some(op) = variant.stopped {
        op.signal("CONT")?;
        wait_stored().await?;
    }
    out.rates.push(rate?);
    for (group, seconds) in spent {
        *out.cpu.entry(group).or_default() += seconds;
    }
    Ok(())
}

/// The rows `subscription` has stored.
async fn stored(pool: &sqlx::PgPool, subscription: &str) -> Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = $1")
            .bind(subscription)
            .fetch_one(pool)
            .await?,
    )
}

/// Waits (up to 120 s) until `subscription` has stored `rows` rows.
async fn drained(pool: &sqlx::PgPool, subscription: &str, rows: i64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = stored(pool, subscription).await?;
        if now >= rows {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{subscription}: {now} of {rows} rows stored after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What every producer round shares: who sends how many, and whose CPU counts.
struct Shape<'a> {
    c1: &'a Node,
    url: &'a str,
    messages: usize,
    cpu: &'a Accounts,
}

/// The bench process (the producer), the cluster's brokers and the operator.
fn accounts(ctx: &Ctx, operator: &Operator) -> Result<Accounts> {
    let mut groups = vec![("bench (producer)".to_string(), vec![std::process::id()])];
    for node in &ctx.jolokia.nodes {
        groups.push((
            format!("broker {}", node.name),
            vec![ctx.bed.broker_pid(&node.name)?],
        ));
    }
    groups.push(("operator".into(), vec![operator.pid()]));
    Ok(Accounts { groups })
}

/// A bare consumer over `queue` (FQQN), discarding: copies per second from its first copy to
/// its `n`-th.
async fn consume_bare(url: &str, queue: &str, n: usize) -> Result<f64> {
    let mut connection =
        Connection::open(format!("bench-bare-{}", uuid::Uuid::new_v4().simple()), url).await?;
    let mut session = Session::begin(&mut connection).await?;
    let mut receiver = Receiver::builder()
        .name("bench-bare-rx")
        .source(format!("{queue}::{queue}"))
        .credit_mode(CreditMode::Manual)
        .attach(&mut session)
        .await?;
    let mut got = 0;
    let mut first: Option<Instant> = None;
    while got < n {
        receiver.set_credit(200).await?;
        let mut batch = vec![];
        let d = tokio::time::timeout(Duration::from_secs(30), receiver.recv::<Body<AmqpValue>>())
            .await
            .map_err(|_| anyhow!("the bare consumer got {got} of {n}"))??;
        first.get_or_insert_with(Instant::now);
        batch.push(d);
        while batch.len() < 200 {
            match tokio::time::timeout(Duration::from_millis(20), receiver.recv::<Body<AmqpValue>>()).await {
                Ok(d) => batch.push(d?),
                Err(_) => break,
            }
        }
        receiver.accept_all(&batch).await?;
        got += batch.len();
    }
    let took = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    let _ = receiver.close().await;
    let _ = session.end().await;
    let _ = connection.close().await;
    Ok((n - 1) as f64 / took.max(1e-6))
}

async fn wait_healthy(install: &Install, subscription: &str, nodes: usize) -> Result<()> {
    use artemis_studio_operator::api::capture::{ArtemisCaptureSubscription, TapState};
    let api: kube::Api<ArtemisCaptureSubscription> =
        kube::Api::namespaced(install.objects.client.clone(), &install.objects.ns);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        install.objects.harness.read(1);
        let s = api.get(subscription).await?;
        let healthy = s.status.as_ref().map_or(0, |st| {
            st.taps.iter().filter(|t| t.state == TapState::Healthy).count()
        });
        if healthy == nodes {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{subscription}: {healthy} of {nodes} taps drained after 180 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn create_subscription(install: &Install, name: &str, address: &str, ring: u64) -> Result<()> {
    use artemis_studio_operator::api::capture::ArtemisCaptureSubscription;
    let s: ArtemisCaptureSubscription = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
        "metadata": {"name": name},
        "spec": {"clusterRef": {"name": "c"}, "queues": address, "ringSize": ring,
                 "maxIngestPerSecond": 1_000_000}
    }))?;
    install.objects.harness.write(1);
    kube::Api::<ArtemisCaptureSubscription>::namespaced(install.objects.client.clone(), &install.objects.ns)
        .create(&kube::api::PostParams::default(), &s)
        .await
        .with_context(|| format!("create ArtemisCaptureSubscription {name}"))?;
    Ok(())
}

/// A non-durable anycast ring queue `name` of `size` on its own address, on `node`.
async fn ring(ctx: &Ctx, node: &Node, name: &str, size: usize) -> Result<()> {
    let config = json!({"name": name, "address": name, "routing-type": "ANYCAST", "durable": false,
        "ring-size": size, "auto-create-address": true});
    let create = json!({"type": "exec", "mbean": node.mbean, "operation": "createQueue(java.lang.String,boolean)",
        "arguments": [config.to_string(), false]});
    ctx.jolokia.post(node, &create).await?;
    Ok(())
}

/// The harness's non-exclusive divert `<to>.divert` from `from` to `to`, on `node`.
async fn create_divert(ctx: &Ctx, node: &Node, from: &str, to: &str) -> Result<()> {
    let name = format!("{to}.divert");
    let exec = json!({"type": "exec", "mbean": node.mbean,
        "operation": "createDivert(java.lang.String,java.lang.String,java.lang.String,java.lang.String,boolean,java.lang.String,java.lang.String)",
        "arguments": [name, name, from, to, false, null, null]});
    ctx.jolokia.post(node, &exec).await?;
    Ok(())
}

/// Destroys the divert `create_divert` made into `to`, on `node`.
async fn destroy_divert(ctx: &Ctx, node: &Node, to: &str) -> Result<()> {
    let exec = json!({"type": "exec", "mbean": node.mbean, "operation": "destroyDivert(java.lang.String)",
        "arguments": [format!("{to}.divert")]});
    ctx.jolokia.post(node, &exec).await?;
    Ok(())
}

/// The divert of `source` into a ring whose address also has a queue on c2 with a consumer
/// attached: a remote binding on c1, so the cluster load-balances copies to c2 (what a tap did
/// before its divert forwarded by FQQN).
async fn forwarded_divert(ctx: &Ctx, shape: &Shape<'_>, source: &str) -> Result<Rounds> {
    let c1 = shape.c1;
    let fwd = format!("{}fwd", ctx.prefix("cap"));
    let c2 = ctx
        .jolokia
        .nodes
        .get(1)
        .cloned()
        .ok_or_else(|| anyhow!("no second node"))?;
    for node in [c1, &c2] {
        ring(ctx, node, &fwd, shape.messages * 2).await?;
    }
    let mut remote = Connection::open(
        format!("bench-remote-{}", uuid::Uuid::new_v4().simple()),
        amqp_url(ctx, &c2.name)?.as_str(),
    )
    .await?;
    let mut remote_session = Session::begin(&mut remote).await?;
    let remote_rx = Receiver::builder()
        .name("bench-remote-rx")
        .source(format!("{fwd}::{fwd}"))
        .credit_mode(CreditMode::Manual)
        .attach(&mut remote_session)
        .await?;
    remote_binding(ctx, c1, &fwd).await?;
    create_divert(ctx, c1, source, &fwd).await?;
    let rounds = interleaved(ctx, shape, &[Variant::to(source)]).await?.pop();
    destroy_divert(ctx, c1, &fwd).await?;
    settled(ctx, &c2, &fwd).await?;
    let _ = remote_rx.close().await;
    let _ = remote_session.end().await;
    let _ = remote.close().await;
    rounds.ok_or_else(|| anyhow!("one variant"))
}

/// The remote binding of `address` (c2's queue with its consumer) reaches `c1` through the
/// cluster: wait for it.
async fn remote_binding(ctx: &Ctx, c1: &Node, address: &str) -> Result<()> {
    let read = json!({"type": "read", "attribute": "BindingNames",
        "mbean": format!("{},component=addresses,address=\"{address}\"", c1.mbean)});
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let names = ctx.jolokia.post(c1, &read).await?;
        // `post` answers with the value: the local binding, then a remote one.
        if names.as_array().is_some_and(|a| a.len() > 1) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("no remote binding for {address} on c1 after 60 s: {names}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Copies still crossing the bridge would load the next variant's rounds: wait until `queue`
/// on `node` stops growing.
async fn settled(ctx: &Ctx, node: &Node, queue: &str) -> Result<()> {
    let added = json!({"type": "read", "attribute": "MessagesAdded", "mbean": queue_mbean(node, queue)});
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = ctx.jolokia.post(node, &added).await?;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = ctx.jolokia.post(node, &added).await?;
        if now == last || Instant::now() > deadline {
            return Ok(());
        }
        last = now;
    }
}

async fn measure(ctx: &Ctx, install: &Install) -> Result<Measured> {
    let m = ctx.cfg.capture_messages;
    let nodes = ctx.jolokia.nodes.len();
    let c1 = ctx
        .jolokia
        .nodes
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("no node"))?;
    let url = amqp_url(ctx, &c1.name)?;
    let pool = sqlx::PgPool::connect(&install.database_url(ctx)?).await?;
    let p = ctx.prefix("cap");
    let (source, lossy) = (format!("{p}src"), format!("{p}lossy"));
    for a in [&source, &lossy] {
        ctx.jolokia.parallel(Op::Create, a).await?;
    }

    // (a) the producer, without a tap (one warm-up round first), then with one. A second source,
    // `plain`, has a divert of the harness's own into a local ring on c1 alone — the broker's
    // divert and ring without the operator's drain, Postgres or the cluster's forwarding of
    // copies — for the whole scenario, so its rounds interleave with the others'.
    let plain = format!("{p}plain");
    ctx.jolokia.parallel(Op::Create, &plain).await?;
    let local = format!("{p}local");
    ring(ctx, &c1, &local, m * 2).await?;
    create_divert(ctx, &c1, &plain, &local).await?;
    produce(&url, &source, m / 4 + 1).await?;
    produce(&url, &plain, m / 4 + 1).await?;
    let cpu = accounts(ctx, &install.operator)?;
    let shape = Shape {
        c1: &c1,
        url: &url,
        messages: m,
        cpu: &cpu,
    };
    let [produce_bare, produce_local_divert_alone]: [Rounds; 2] =
        interleaved(ctx, &shape, &[Variant::to(&source), Variant::to(&plain)])
            .await?
            .try_into()
            .map_err(|_| anyhow!("two variants"))?;
    let ingest_messages = m * 2;
    let produce_forwarded_divert = forwarded_divert(ctx, &shape, &source).await?;
    create_subscription(install, "bench-tap", &source, (ingest_messages * 2) as u64).await?;
    wait_healthy(install, "bench-tap", nodes).await?;
    // The tap, the local divert beside it (the headline's baseline, in the same rounds), and the
    // tap with the operator stopped: the broker's side of a tap alone (divert and ring).
    let [produce_tapped, produce_local_divert, produce_tapped_stopped]: [Rounds; 3] = interleaved(
        ctx,
        &shape,
        &[
            Variant::to(&source).tapped(&pool, "bench-tap"),
            Variant::to(&plain),
            Variant::to(&source)
                .tapped(&pool, "bench-tap")
                .stopped(&install.operator),
        ],
    )
    .await?
    .try_into()
    .map_err(|_| anyhow!("three variants"))?;
    destroy_divert(ctx, &c1, &local).await?;

    // (b) ingest: a bare ring beside the operator's, fed by a divert of its own; both preloaded
    // with the same copies while the operator is stopped (SIGSTOP).
    let bare = format!("{p}bare");
    ring(ctx, &c1, &bare, ingest_messages * 2).await?;
    create_divert(ctx, &c1, &source, &bare).await?;
    let before = stored(&pool, "bench-tap").await?;
    let paused_at = chrono::Utc::now();
    install.operator.signal("STOP")?;
    let produced = produce(&url, &source, ingest_messages).await;
    install.operator.signal("CONT")?;
    produced?;
    let deadline = Instant::now() + Duration::from_secs(300);
    while stored(&pool, "bench-tap").await? < before + ingest_messages as i64 {
        if Instant::now() > deadline {
            bail!("the drain did not store {ingest_messages} copies within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // From the first batch's commit to the last: copies per second after the first batch.
    let (n, span): (i64, f64) = sqlx::query_as(
        "SELECT count(*), EXTRACT(EPOCH FROM max(captured_at) - min(captured_at))::float8 \
         FROM captured_message WHERE subscription = 'bench-tap' AND captured_at > $1",
    )
    .bind(paused_at)
    .fetch_one(&pool)
    .await?;
    let first_batch: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM captured_message WHERE subscription = 'bench-tap' AND captured_at = \
         (SELECT min(captured_at) FROM captured_message WHERE subscription = 'bench-tap' AND captured_at > $1)",
    )
    .bind(paused_at)
    .fetch_one(&pool)
    .await?;
    let ingest_drain = (n - first_batch) as f64 / span.max(1e-6);
    let ingest_bare = consume_bare(&url, &bare, ingest_messages).await?;

    // (c) loss when the ring bites.
    create_subscription(install, "bench-lossy", &lossy, 100).await?;
    wait_healthy(install, "bench-lossy", nodes).await?;
    let loss_sent = m as i64;
    install.operator.signal("STOP")?;
    let produced = produce(&url, &lossy, m).await;
    install.operator.signal("CONT")?;
    produced?;
    let counts = |pool: sqlx::PgPool| async move {
        let stored: i64 =
            sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE subscription = 'bench-lossy'")
                .fetch_one(&pool)
                .await?;
        let reported: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(messages), 0)::bigint FROM capture_loss WHERE subscription = 'bench-lossy'",
        )
        .fetch_one(&pool)
        .await?;
        Ok::<_, sqlx::Error>((stored, reported))
    };
    // Settled when stored + reported has not moved for 10 s (or accounts for every copy).
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = (-1, -1);
    let mut still_since = Instant::now();
    let (loss_stored, loss_reported) = loop {
        let now = counts(pool.clone()).await?;
        if now.0 + now.1 == loss_sent || (now == last && still_since.elapsed() > Duration::from_secs(10)) {
            break now;
        }
        if now != last {
            last = now;
            still_since = Instant::now();
        }
        if Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    pool.close().await;
    Ok(Measured {
        messages: m,
        produce_bare,
        produce_local_divert_alone,
        produce_local_divert,
        produce_forwarded_divert,
        produce_tapped,
        produce_tapped_stopped,
        ingest_messages,
        ingest_drain,
        ingest_bare,
        loss_sent,
        loss_stored,
        loss_reported,
    })
}

fn section(r: &Measured) -> Section {
    let mut s = Section::new(
        "capture",
        "3. Capture",
        "On cluster c, node c1. (a) One AMQP producer sends 1 KiB messages (durable, to a durable queue unless the settings say otherwise), each awaited, after a warm-up round; every round starts from an empty source queue. The target (../shared/design/OPERATOR.md, outside this repository) is the tap ÷ the broker's own divert into a local ring, the physical limit of a divert-based tap. The local divert is a divert of the harness's own from a second source address on c1 into a non-durable ring on c1 alone (the broker's divert and ring, nothing else); its rounds are interleaved with the others' (one round of each variant, then again), before the subscription with the rounds without a tap, and after it with the tap's: the headline compares the tap with the local divert of the same rounds. The other variants: a divert whose ring address is also consumed on c2 (a remote binding: the cluster load-balances the copies to c2, what a tap did before its divert forwarded by FQQN), and the tap with the operator SIGSTOPped (the broker's side of a tap, without the drain's and Postgres's CPU). (b) The same copies preloaded in the operator's capture ring (the operator SIGSTOPped while they were produced) and in a bare ring fed by a divert of the harness's own: the drain's ingest into Postgres (from its first batch's commit to its last, in `captured_at`) vs. a bare AMQP consumer that discards (manual credit, 200 at a time, accept per batch). The CPU each process used during each variant's rounds (/proc, user + system) is shown per 1,000 messages: where the cost goes on the bed's shared cores. (c) A ring of 100 and the drain paused while the producer sends: copies actually lost (sent − stored) vs. the loss the operator reports in `capture_loss`.",
    );
    let median = |v: &Rounds| Summary::of(&v.rates).map_or(f64::NAN, |x| x.median);
    let target_ratio = median(&r.produce_tapped) / median(&r.produce_local_divert);
    let ingest_ratio = r.ingest_drain / r.ingest_bare;
    let actual = r.loss_sent - r.loss_stored;
    let loss_ratio = r.loss_reported as f64 / (actual as f64).max(1.0);
    let mut t = producer_table(r);
    t.row(vec![
        format!("ingest copies/s, {} preloaded", r.ingest_messages),
        format!("{:.0}", r.ingest_drain),
        format!("{:.0} (bare consumer)", r.ingest_bare),
        format!("{ingest_ratio:.2}"),
        "≥ 0.8".into(),
    ]);
    t.row(vec![
        format!("loss reported, {} sent into a ring of 100", r.loss_sent),
        format!("{}", r.loss_reported),
        format!("{actual} (sent − stored)"),
        format!("{loss_ratio:.3}"),
        "1.0".into(),
    ]);
    s.tables.push(t);
    s.tables.push(cpu_table(r));
    s.headlines.push(Headline {
        what: "producer throughput with a tap ÷ with the broker's own divert into a local ring".into(),
        measured: format!("{target_ratio:.2}"),
        target: "≥ 0.95".into(),
        met: Some(target_ratio >= 0.95),
    });
    s.headlines.push(Headline {
        what: "capture ingest into Postgres ÷ a bare discarding consumer".into(),
        measured: format!("{ingest_ratio:.2}"),
        target: "≥ 0.8".into(),
        met: Some(ingest_ratio >= 0.8),
    });
    s.headlines.push(Headline {
        what: "loss reported ÷ actual when the ring bites".into(),
        measured: format!("{loss_ratio:.3}"),
        target: "1.0".into(),
        met: Some((loss_ratio - 1.0).abs() <= 0.01),
    });
    s.notes.push("The drain's rate is measured from the commit of its first batch, so it excludes the attach and the first batch; the bare consumer's from its first copy. One run of (b) and (c): no spread. CPU is per 1,000 messages sent, summed over a variant's rounds; a tap's round ends when the drain has stored its copies, so the drain's catching up after the producer's last message counts in it (with the operator stopped, it happens after the round, outside it); \"everything else\" is the machine's busy time no listed process accounts for (the API server, etcd, the other brokers of the bed), and \"idle\" is the cores' unused time: near zero when the producer is CPU-bound.".into());
    let variants = variants(r);
    s.json = json!({
        "messages": r.messages,
        "producer": variants.iter().map(|(name, v)| json!({"variant": name, "rates": v.rates, "cpuSeconds": v.cpu})).collect::<Vec<_>>(),
        "tapOverLocalDivert": target_ratio,
        "ingest": {"copies": r.ingest_messages, "drainPerSecond": r.ingest_drain, "barePerSecond": r.ingest_bare, "ratio": ingest_ratio},
        "loss": {"sent": r.loss_sent, "stored": r.loss_stored, "reported": r.loss_reported, "actual": actual, "ratio": loss_ratio},
    });
    s
}

/// The producer's variants in the order they ran, by the name the tables give them.
fn variants(r: &Measured) -> [(&'static str, &Rounds); 6] {
    [
        ("no tap", &r.produce_bare),
        (
            "a local divert (no subscription yet)",
            &r.produce_local_divert_alone,
        ),
        ("a divert forwarded to c2", &r.produce_forwarded_divert),
        ("the tap", &r.produce_tapped),
        ("a local divert (beside the tap)", &r.produce_local_divert),
        ("the tap, the operator SIGSTOPped", &r.produce_tapped_stopped),
    ]
}

fn producer_table(r: &Measured) -> Table {
    let local = Summary::of(&r.produce_local_divert.rates);
    let bare = Summary::of(&r.produce_bare.rates);
    let mut t = Table::new(&["measure", "value", "baseline", "ratio", "target"]);
    let ratio = |x: Option<Summary>, b: Option<Summary>| match (x, b) {
        (Some(x), Some(b)) => format!("{:.2}", x.median / b.median),
        _ => "-".into(),
    };
    let tapped = Summary::of(&r.produce_tapped.rates);
    t.row(vec![
        format!("producer msg/s with the tap, {} msgs per round", r.messages),
        show(tapped, 0),
        format!("{} (the local divert, same rounds)", show(local, 0)),
        ratio(tapped, local),
        "≥ 0.95".into(),
    ]);
    for (name, v) in variants(r) {
        let x = Summary::of(&v.rates);
        t.row(vec![
            format!("  {name}"),
            show(x, 0),
            format!("{} (no tap)", show(bare, 0)),
            ratio(x, bare),
            "-".into(),
        ]);
    }
    t
}

/// CPU milliseconds per 1,000 messages sent, by process group (rows) and variant (columns).
fn cpu_table(r: &Measured) -> Table {
    let variants = variants(r);
    let mut header = vec!["CPU ms per 1,000 messages"];
    header.extend(variants.iter().map(|(name, _)| *name));
    let mut t = Table::new(&header);
    let mut groups: Vec<&String> = variants.iter().flat_map(|(_, v)| v.cpu.keys()).collect();
    groups.sort();
    groups.dedup();
    for group in groups {
        let mut row = vec![group.clone()];
        for (_, v) in &variants {
            let sent = (v.rates.len() * r.messages) as f64;
            row.push(
                v.cpu
                    .get(group)
                    .map_or("-".into(), |s| format!("{:.0}", s * 1e6 / sent.max(1.0))),
            );
        }
        t.row(row);
    }
    t
}
