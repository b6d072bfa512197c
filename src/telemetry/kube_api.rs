//! Kubernetes API requests the operator makes, counted on the client side: a tower layer in
//! kube's client stack, `artemis_studio_api_requests_total{verb, kind, code}`.
//!
//! `verb` is the Kubernetes verb (get, list, watch, create, update, patch, delete,
//! deletecollection), derived from the method, whether the path names an object, and
//! `watch=true`; `kind` is the resource plural from the path with its subresource
//! (`artemisqueues/status`), or `discovery` for `/api`, `/apis`, `/version` and the like;
//! `code` is the response status class (`2xx` … `5xx`), or `error` when no response came.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    pub verb: String,
    pub kind: String,
    pub code: String,
}

/// The API request counter family of one `Metrics`.
#[derive(Clone, Debug, Default)]
pub struct ApiMetrics {
    pub requests: Family<ApiRequestLabels, Counter>,
}

impl ApiMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "api_requests",
            "Kubernetes API requests by verb, resource and response status class",
            self.requests.clone(),
        );
    }

    /// Requests of this verb and kind, whatever their answer.
    pub fn count(&self, verb: &str, kind: &str) -> u64 {
        ["2xx", "3xx", "4xx", "5xx", "1xx", "error"]
            .iter()
            .map(|code| {
                self.requests
                    .get(&ApiRequestLabels {
                        verb: verb.into(),
                        kind: kind.into(),
                        code: (*code).into(),
                    })
                    .map_or(0, |c| c.get())
            })
            .sum()
    }
}

/// The Kubernetes verb and resource of a request (pure; see the module doc).
pub fn classify(method: &http::Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/… (core) or /apis/<group>/<version>/…
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => rest,
        ["apis", _group, _version, rest @ ..] if !rest.is_empty() => rest,
        _ => return (verb_of(method, false, false), "discovery".into()),
    };
    // The legacy watch prefix: /api/v1/watch/namespaces/…
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    // Namespaced: namespaces/<ns>/<resource>[/<name>[/<subresource>]]. The namespace object
    // itself: namespaces[/<name>[/<subresource>]].
    let (resource, name, sub) = match rest {
        ["namespaces", _ns, resource, tail @ ..]
            if !is_namespace_subresource(resource) || !tail.is_empty() =>
        {
            (*resource, tail.first().copied(), tail.get(1).copied())
        }
        [resource, tail @ ..] => (*resource, tail.first().copied(), tail.get(1).copied()),
        [] => return (verb_of(method, false, false), "discovery".into()),
    };
    let watch = legacy_watch
        || query.is_some_and(|q| {
            q.split('&')
                .any(|kv| matches!(kv.split_once('='), Some(("watch", "true" | "1"))))
        });
    let kind = match sub {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    (verb_of(method, name.is_some(), watch), kind)
}

/// `namespaces/<name>/status` and `/finalize` are subresources of a namespace, not resources in it.
fn is_namespace_subresource(segment: &str) -> bool {
    matches!(segment, "status" | "finalize")
}

fn verb_of(method: &http::Method, named: bool, watch: bool) -> &'static str {
    match *method {
        http::Method::GET if watch => "watch",
        http::Method::GET if named => "get",
        http::Method::GET => "list",
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE if named => "delete",
        http::Method::DELETE => "deletecollection",
        _ => "other",
    }
}

fn code_class(status: http::StatusCode) -> &'static str {
    match status.as_u16() {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// The layer: add it with `ClientBuilder::with_layer`.
#[derive(Clone, Debug)]
pub struct ApiMetricsLayer {
    requests: Family<ApiRequestLabels, Counter>,
}

impl ApiMetricsLayer {
    pub fn new(metrics: &ApiMetrics) -> Self {
        ApiMetricsLayer {
            requests: metrics.requests.clone(),
        }
    }
}

impl<S> tower::Layer<S> for ApiMetricsLayer {
    type Service = ApiMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ApiMetricsService {
            inner,
            requests: self.requests.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ApiMetricsService<S> {
    inner: S,
    requests: Family<ApiRequestLabels, Counter>,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for ApiMetricsService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let (verb, kind) = classify(request.method(), request.uri().path(), request.uri().query());
        let requests = self.requests.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => code_class(r.status()),
                Err(_) => "error",
            };
            requests
                .get_or_create(&ApiRequestLabels {
                    verb: verb.into(),
                    kind,
                    code: code.into(),
                })
                .inc();
            result
        })
    }
}

/// A Kubernetes client (kubeconfig or in-cluster, as `kube::Client::try_default`) whose requests
/// are counted in `metrics`.
pub async fn api_client(metrics: Arc<Metrics>) -> anyhow::Result<kube::Client> {
    api_client_with(kube::Config::infer().await?, &metrics)
}

/// A Kubernetes client for this configuration whose requests are counted in `metrics`.
pub fn api_client_with(config: kube::Config, metrics: &Metrics) -> anyhow::Result<kube::Client> {
    let client = kube::client::ClientBuilder::try_from(config)?
        .with_layer(&ApiMetricsLayer::new(&metrics.kube_api))
        .build();
    Ok(client)
}

#[cfg(test)]
mod tests {
    use http::Method;

    use super::*;

    fn c(method: Method, path_and_query: &str) -> (&'static str, String) {
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        classify(&method, path, query)
    }

    #[test]
    fn verbs_and_kinds_of_example_paths() {
        let g = "/apis/artemis-studio.io/v1alpha1";
        for (method, path, verb, kind) in [
            (
                Method::GET,
                format!("{g}/namespaces/ns/artemisqueues/q1"),
                "get",
                "artemisqueues",
            ),
            (
                Method::GET,
                format!("{g}/namespaces/ns/artemisqueues"),
                "list",
                "artemisqueues",
            ),
            (
                Method::GET,
                format!("{g}/artemisqueues?limit=500"),
                "list",
                "artemisqueues",
            ),
            (
                Method::GET,
                format!(
                    "{g}/artemisqueues?allowWatchBookmarks=true&resourceVersion=12&watch=true&timeoutSeconds=290"
                ),
                "watch",
                "artemisqueues",
            ),
            (
                Method::GET,
                format!("{g}/namespaces/ns/artemisqueues?watch=1"),
                "watch",
                "artemisqueues",
            ),
            (
                Method::PATCH,
                format!("{g}/namespaces/ns/artemisqueues/q1/status?fieldManager=x&force=true"),
                "patch",
                "artemisqueues/status",
            ),
            (
                Method::PATCH,
                format!("{g}/namespaces/ns/artemisqueues/q1"),
                "patch",
                "artemisqueues",
            ),
            (
                Method::PUT,
                format!("{g}/namespaces/ns/connectioncloses/c/status"),
                "update",
                "connectioncloses/status",
            ),
            (
                Method::DELETE,
                format!("{g}/namespaces/ns/artemisdiverts/d"),
                "delete",
                "artemisdiverts",
            ),
            (
                Method::DELETE,
                format!("{g}/namespaces/ns/artemisdiverts"),
                "deletecollection",
                "artemisdiverts",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/secrets/creds".into(),
                "get",
                "secrets",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/pods?labelSelector=app%3Db".into(),
                "list",
                "pods",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ns/events".into(),
                "create",
                "events",
            ),
            (
                Method::POST,
                "/apis/events.k8s.io/v1/namespaces/ns/events".into(),
                "create",
                "events",
            ),
            (
                Method::GET,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/op".into(),
                "get",
                "leases",
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/op".into(),
                "update",
                "leases",
            ),
            (Method::GET, "/api/v1/namespaces/ns".into(), "get", "namespaces"),
            (Method::GET, "/api/v1/namespaces".into(), "list", "namespaces"),
            (
                Method::PUT,
                "/api/v1/namespaces/ns/finalize".into(),
                "update",
                "namespaces/finalize",
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/ns/secrets".into(),
                "watch",
                "secrets",
            ),
            (
                Method::GET,
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/x".into(),
                "get",
                "customresourcedefinitions",
            ),
            (Method::GET, "/api".into(), "list", "discovery"),
            (
                Method::GET,
                "/apis/artemis-studio.io/v1alpha1".into(),
                "list",
                "discovery",
            ),
            (Method::GET, "/version".into(), "list", "discovery"),
        ] {
            assert_eq!(
                c(method.clone(), &path),
                (verb, kind.to_string()),
                "{method} {path}"
            );
        }
    }

    #[test]
    fn status_classes() {
        assert_eq!(code_class(http::StatusCode::OK), "2xx");
        assert_eq!(code_class(http::StatusCode::CONFLICT), "4xx");
        assert_eq!(code_class(http::StatusCode::SERVICE_UNAVAILABLE), "5xx");
    }

    #[tokio::test]
    async fn the_layer_counts_each_request_once() {
        use tower::{Layer, Service};

        /// Answers 404 to everything.
        struct NotFound;
        impl Service<http::Request<()>> for NotFound {
            type Response = http::Response<()>;
            type Error = std::convert::Infallible;
            type Future = std::future::Ready<Result<Self::Response, Self::Error>>;
            fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _: http::Request<()>) -> Self::Future {
                let mut response = http::Response::new(());
                *response.status_mut() = http::StatusCode::NOT_FOUND;
                std::future::ready(Ok(response))
            }
        }

        let metrics = ApiMetrics::default();
        let mut svc = ApiMetricsLayer::new(&metrics).layer(NotFound);
        for _ in 0..3 {
            let req = http::Request::get("/api/v1/namespaces/ns/secrets/s")
                .body(())
                .unwrap_or_default();
            let resp = svc.call(req).await;
            assert!(resp.is_ok());
        }
        assert_eq!(metrics.count("get", "secrets"), 3);
        assert_eq!(
            metrics
                .requests
                .get_or_create(&ApiRequestLabels {
                    verb: "get".into(),
                    kind: "secrets".into(),
                    code: "4xx".into()
                })
                .get(),
            3
        );
    }
}
