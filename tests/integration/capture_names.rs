//! Issue 42 item 2: names that cannot collide. Subscriptions of the same name in two namespaces,
//! each on its own ArtemisCluster over the same brokers, on one address: each gets its own
//! capture queues (the broker names carry the namespace) and stores every message — judged from
//! the brokers and the database.

use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use artemis_studio_operator::api::capture::{ArtemisCaptureSubscription, TapState};
use artemis_studio_operator::api::capture_names::TapName;

use crate::capture::{amqp_send, broker_queue, divert_names, taps_in};
use crate::support::{TestBed, brokers_shared, create_cluster, short_id, wait_cluster_condition, wait_until};

const MESSAGES: usize = 300;
const SUBSCRIPTION: &str = "same";

async fn subscribe(admin: &kube::Client, ns: &str, address: &str) {
    let s: ArtemisCaptureSubscription = serde_json::from_value(json!({
        "apiVersion": "artemis-studio.io/v1alpha1", "kind": "ArtemisCaptureSubscription",
        "metadata": {"name": SUBSCRIPTION, "annotations": {"artemis-studio.io/confirm-without-review": "true"}},
        "spec": {"clusterRef": {"name": "c"}, "queues": address}
    }))
    .expect("subscription json");
    Api::<ArtemisCaptureSubscription>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("create ArtemisCaptureSubscription");
}

async fn stored(pool: &sqlx::PgPool, ns: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM captured_message WHERE cluster = $1 AND subscription = $2")
        .bind(format!("{ns}/c"))
        .bind(SUBSCRIPTION)
        .fetch_one(pool)
        .await
        .expect("count stored rows")
}

#[tokio::test]
async fn same_named_subscriptions_of_two_namespaces_on_shared_brokers_each_store_every_message() {
    let _shared = brokers_shared().await;
    let bed = TestBed::get();
    let namespaces = [
        bed.fresh_namespace("cap-n1").await,
        bed.fresh_namespace("cap-n2").await,
    ];
    let id = short_id();
    let _clean = bed.clean_up(&[&id]);
    let op = bed
        .start_operator_for(&[namespaces[0].as_str(), namespaces[1].as_str()])
        .await;
    let admin = bed.kube_admin().await;
    let urls: Vec<String> = bed.cluster_brokers("c").into_iter().map(|b| b.jolokia).collect();
    for ns in &namespaces {
        create_cluster(&admin, ns, "c", &urls, Some(bed.broker_user())).await;
        wait_cluster_condition(&admin, ns, "c", "Ready", "True").await;
    }
    let address = format!("cap.{id}.same");
    broker_queue(&bed, &address).await;
    for ns in &namespaces {
        subscribe(&admin, ns, &address).await;
    }
    for ns in &namespaces {
        let api: Api<ArtemisCaptureSubscription> = Api::namespaced(admin.clone(), ns);
        wait_until(
            &format!("{ns}/{SUBSCRIPTION}: 3 taps HEALTHY"),
            Duration::from_secs(120),
            || {
                let api = api.clone();
                async move {
                    let s = api.get(SUBSCRIPTION).await.ok()?;
                    (taps_in(&s, TapState::Healthy) == 3).then_some(())
                }
            },
        )
        .await;
    }
    // On the brokers: one divert per namespace on every node, each into its own ring.
    let instance = op.ctx.instance_id.clone();
    for b in bed.cluster_brokers("c") {
        let diverts = divert_names(&bed, &b).await;
        for ns in &namespaces {
            let tap = TapName::new(&instance, ns, &address, SUBSCRIPTION);
            assert!(
                diverts.contains(&tap.divert()),
                "{}: no divert {}",
                b.name,
                tap.divert()
            );
        }
    }

    amqp_send(&bed, "c1", &address, MESSAGES, &id)
        .await
        .expect("send");
    let pool = op.store.pool().clone();
    wait_until(
        &format!("{MESSAGES} rows stored for each namespace's {SUBSCRIPTION}"),
        Duration::from_secs(90),
        || {
            let (pool, namespaces) = (&pool, &namespaces);
            async move {
                let mut all = true;
                for ns in namespaces {
                    all &= stored(pool, ns).await >= MESSAGES as i64;
                }
                all.then_some(())
            }
        },
    )
    .await;
    for ns in &namespaces {
        assert_eq!(
            stored(&pool, ns).await,
            MESSAGES as i64,
            "{ns}/{SUBSCRIPTION}: every message, once"
        );
    }

    // Clean up: each subscription sweeps its own taps.
    for ns in &namespaces {
        let api: Api<ArtemisCaptureSubscription> = Api::namespaced(admin.clone(), ns);
        api.delete(SUBSCRIPTION, &DeleteParams::default())
            .await
            .expect("delete subscription");
        wait_until(
            &format!("{ns}/{SUBSCRIPTION} gone"),
            Duration::from_secs(120),
            || {
                let api = api.clone();
                async move {
                    api.get_opt(SUBSCRIPTION)
                        .await
                        .ok()
                        .flatten()
                        .is_none()
                        .then_some(())
                }
            },
        )
        .await;
    }
}
