//! Scenario 4, footprint: the operator process's resident memory and CPU at idle, first with
//! only the cluster (the baseline, same process, same run), then with N queues and S capture
//! subscriptions (each over one of the queues, so each installs a tap on every node: the
//! default 334 make 1,002 taps on the three nodes). With them, what capture costs at idle
//! (issue 42): AMQP connections per node, Postgres writes per second, Jolokia operations per
//! capture pass, and the bytes of every status.

use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use crate::install::{Ctx, Install, settle};
use crate::objects::QueueWatch;
use crate::report::{Headline, Section, Table};

struct Idle {
    rss_mib: f64,
    /// CPU seconds per second (1.0 = one core busy).
    cpu_cores: f64,
    jolokia_per_poll: f64,
    /// Jolokia operations in the window by kind (read, search, or the operation).
    jolokia_by_kind: std::collections::BTreeMap<String, f64>,
    /// Jolokia operations in the window ÷ capture passes in it (NaN without a pass).
    jolokia_per_capture_pass: f64,
    /// Rows written (inserted, updated, deleted) per second in the installation's database.
    pg_rows_per_s: f64,
    /// Transactions committed per second there.
    pg_commits_per_s: f64,
    /// Each node's client connections (`ConnectionCount`) at the window's end.
    connections: std::collections::BTreeMap<String, f64>,
    /// The serialised statuses of every ArtemisQueue and ArtemisCaptureSubscription, bytes.
    status_bytes: usize,
}

async fn idle(ctx: &Ctx, install: &Install) -> Result<Idle> {
    let op = &install.operator;
    let (cpu0, c0, pg0) = (
        op.cpu_seconds()?,
        op.counts().await?,
        pg_counts(ctx, install).await?,
    );
    let start = std::time::Instant::now();
    settle(Duration::from_secs(ctx.cfg.idle_seconds)).await;
    let (cpu1, c1, pg1) = (
        op.cpu_seconds()?,
        op.counts().await?,
        pg_counts(ctx, install).await?,
    );
    let window = start.elapsed().as_secs_f64();
    let d = c1.since(&c0);
    Ok(Idle {
        jolokia_per_capture_pass: if d.capture_passes > 0.0 {
            d.jolokia() / d.capture_passes
        } else {
            f64::NAN
        },
        pg_rows_per_s: (pg1.0 - pg0.0) / window,
        pg_commits_per_s: (pg1.1 - pg0.1) / window,
        connections: connections(ctx).await?,
        status_bytes: status_bytes(&install.objects).await?,
        rss_mib: op.rss_bytes()? as f64 / 1024.0 / 1024.0,
        cpu_cores: (cpu1 - cpu0) / window,
        jolokia_per_poll: if d.polls > 0.0 {
            d.jolokia() / d.polls
        } else {
            f64::NAN
        },
        jolokia_by_kind: d.jolokia_by_kind,
    })
}

/// Rows written and transactions committed so far in the installation's database (Postgres's
/// own statistics; the reading's own transaction is one commit).
async fn pg_counts(ctx: &Ctx, install: &Install) -> Result<(f64, f64)> {
    let pool = sqlx::PgPool::connect(&install.database_url(ctx)?).await?;
    // Rows of the installation's own tables: the system catalogs' rows (autovacuum's ANALYZE
    // after the arming's inserts, a partition made) are not the operator's writes.
    let (rows, commits): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) FROM pg_stat_user_tables)::bigint, \
         xact_commit::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok((rows as f64, commits as f64))
}

/// Each node's client connections now, read from the broker.
async fn connections(ctx: &Ctx) -> Result<std::collections::BTreeMap<String, f64>> {
    let mut out = std::collections::BTreeMap::new();
    for node in &ctx.jolokia.nodes {
        let read = json!({"type": "read", "mbean": node.mbean, "attribute": "ConnectionCount"});
        let n = ctx.jolokia.post(node, &read).await?.as_f64().unwrap_or(f64::NAN);
        out.insert(node.name.clone(), n);
    }
    Ok(out)
}

/// Bytes of every ArtemisQueue's and ArtemisCaptureSubscription's status, as JSON.
async fn status_bytes(o: &crate::objects::Objects) -> Result<usize> {
    use artemis_studio_operator::api::ArtemisQueue;
    use artemis_studio_operator::api::capture::ArtemisCaptureSubscription;
    use kube::api::{Api, ListParams};
    let queues = Api::<ArtemisQueue>::namespaced(o.client.clone(), &o.ns)
        .list(&ListParams::default())
        .await?;
    let subs = Api::<ArtemisCaptureSubscription>::namespaced(o.client.clone(), &o.ns)
        .list(&ListParams::default())
        .await?;
    let q: usize = queues.items.iter().map(|q| json_len(&q.status)).sum();
    let s: usize = subs.items.iter().map(|s| json_len(&s.status)).sum();
    Ok(q + s)
}

fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map(|v| v.len()).unwrap_or(0)
}

pub async fn run(ctx: &Ctx) -> Result<Section> {
    let install = Install::up(ctx, "footprint", &[]).await?;
    let result = measure(ctx, &install).await;
    install.down(ctx).await;
    let (empty, loaded) = result?;
    Ok(section(ctx, &empty, &loaded))
}

async fn measure(ctx: &Ctx, install: &Install) -> Result<(Idle, Idle)> {
    settle(Duration::from_secs(3)).await;
    let empty = idle(ctx, install).await?;
    let n = ctx.cfg.footprint_queues;
    let names = ctx.queue_names("fp", n);
    let watch = QueueWatch::start(&install.objects);
    let o = &install.objects;
    o.create_queues(&names).await?;
    watch
        .wait_all(&names, ctx.cfg.wait_for(n), "Ready", |s| s.ready)
        .await?;
    for (k, q) in names.iter().take(ctx.cfg.footprint_subscriptions).enumerate() {
        o.create_subscription(&format!("bench-sub-{k}"), q).await?;
    }
    // A subscription change triggers a capture pass; wait until every tap is in place and
    // drained (its day partitions made, its coverage open), then let that settle: the window
    // measures idle, not the arming.
    o.wait_taps(ctx.jolokia.nodes.len(), Duration::from_secs(240))
        .await?;
    settle(Duration::from_secs(10)).await;
    let loaded = idle(ctx, install).await;
    // Taps go first (their sweep needs the operator), then the queues.
    let subs = o.delete_subscriptions(Duration::from_secs(120)).await;
    o.delete_queues(&names).await?;
    let gone = watch
        .wait_all(&names, ctx.cfg.wait_for(n), "deleted", |s| s.deleted)
        .await;
    subs?;
    gone?;
    Ok((empty, loaded?))
}

/// Postgres rows per second capture may write at idle whatever its taps: each node's heartbeat
/// row every `COVERAGE_CONFIRM`, and half a row per second for the process's own heartbeat and
/// its passes' rows.
fn idle_rows_bound(nodes: usize) -> f64 {
    let beat = artemis_studio_operator::capture::drain::COVERAGE_CONFIRM.as_secs_f64();
    nodes as f64 / beat + 0.5
}

/// Client connections per node the load added (the most on any node).
fn added_connections(empty: &Idle, loaded: &Idle) -> f64 {
    loaded
        .connections
        .iter()
        .map(|(node, n)| n - empty.connections.get(node).copied().unwrap_or(0.0))
        .fold(0.0, f64::max)
}

fn capture_cost_table(empty: &Idle, loaded: &Idle) -> Table {
    let mut t = Table::new(&[
        "state",
        "client connections by node",
        "Postgres rows written/s (its own tables)",
        "Postgres commits/s",
        "Jolokia ops ÷ capture passes",
        "status bytes",
    ]);
    for (state, i) in [("cluster only", empty), ("loaded", loaded)] {
        let conns = i
            .connections
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        t.row(vec![
            state.into(),
            conns,
            format!("{:.2}", i.pg_rows_per_s),
            format!("{:.2}", i.pg_commits_per_s),
            format!("{:.1}", i.jolokia_per_capture_pass),
            i.status_bytes.to_string(),
        ]);
    }
    t
}

fn section(ctx: &Ctx, empty: &Idle, loaded: &Idle) -> Section {
    let n = ctx.cfg.footprint_queues;
    let subs = ctx.cfg.footprint_subscriptions;
    let mut s = Section::new(
        "footprint",
        "4. Footprint",
        "The operator process at idle (no change to make) for the idle window: resident memory (VmRSS) at its end and CPU (user + system) over it, first with only the ArtemisCluster (baseline), then with N ArtemisQueues and S ArtemisCaptureSubscriptions (each over one of the queues: one tap per subscription on every node, installed before the window), capture passes at their default interval (30 s). One run each: no spread.",
    );
    let mut t = Table::new(&[
        "state",
        "RSS MiB",
        "CPU, % of one core",
        "Jolokia ops ÷ cluster polls (capture passes included)",
    ]);
    t.row(vec![
        "cluster only".into(),
        format!("{:.1}", empty.rss_mib),
        format!("{:.2}", empty.cpu_cores * 100.0),
        format!("{:.1}", empty.jolokia_per_poll),
    ]);
    t.row(vec![
        format!("{n} queues, {subs} subscriptions"),
        format!("{:.1}", loaded.rss_mib),
        format!("{:.2}", loaded.cpu_cores * 100.0),
        format!("{:.1}", loaded.jolokia_per_poll),
    ]);
    t.row(vec![
        "ratio".into(),
        format!("{:.2}", loaded.rss_mib / empty.rss_mib),
        format!("{:.2}", loaded.cpu_cores / empty.cpu_cores.max(1e-9)),
        format!("{:.2}", loaded.jolokia_per_poll / empty.jolokia_per_poll),
    ]);
    s.tables.push(t);
    s.tables.push(capture_cost_table(empty, loaded));
    s.headlines.push(Headline {
        what: format!("idle cost of {} capture taps", subs * ctx.jolokia.nodes.len()),
        measured: format!(
            "{:.0} AMQP connection(s) per node more than cluster only, {:.2} Postgres rows/s, {:.1} Jolokia ops per capture pass, {} KiB of status",
            added_connections(empty, loaded),
            loaded.pg_rows_per_s,
            loaded.jolokia_per_capture_pass,
            loaded.status_bytes / 1024
        ),
        target: format!(
            "per node, not per tap (connections constant in taps; Postgres rows/s at most one heartbeat row per node every {} s, and the process's own, ≤ {:.1})",
            artemis_studio_operator::capture::drain::COVERAGE_CONFIRM.as_secs(),
            idle_rows_bound(ctx.jolokia.nodes.len())
        ),
        met: Some(
            added_connections(empty, loaded) <= 2.0
                && loaded.pg_rows_per_s <= idle_rows_bound(ctx.jolokia.nodes.len()),
        ),
    });
    s.headlines.push(Headline {
        what: format!("idle with {n} queues and {subs} subscriptions: RSS, CPU"),
        measured: format!(
            "{:.1} MiB ({:.2}× cluster only), {:.2}% of a core",
            loaded.rss_mib,
            loaded.rss_mib / empty.rss_mib,
            loaded.cpu_cores * 100.0
        ),
        target: "reported".into(),
        met: None,
    });
    s.notes
        .push(format!("Idle windows of {} s.", ctx.cfg.idle_seconds));
    let kinds = |i: &Idle| {
        i.jolokia_by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    s.notes.push(format!(
        "Jolokia operations in the idle window by kind — cluster only: {}; loaded: {}.",
        kinds(empty),
        kinds(loaded)
    ));
    s.json = json!({
        "queues": n, "subscriptions": subs, "idleSeconds": ctx.cfg.idle_seconds,
        "clusterOnly": idle_json(empty),
        "loaded": idle_json(loaded),
    });
    s
}

fn idle_json(i: &Idle) -> serde_json::Value {
    json!({
        "rssMiB": i.rss_mib, "cpuCores": i.cpu_cores, "jolokiaOpsPerPoll": i.jolokia_per_poll,
        "jolokiaOpsByKind": i.jolokia_by_kind, "jolokiaOpsPerCapturePass": i.jolokia_per_capture_pass,
        "postgresRowsPerSecond": i.pg_rows_per_s, "postgresCommitsPerSecond": i.pg_commits_per_s,
        "connectionsByNode": i.connections, "statusBytes": i.status_bytes,
    })
}
