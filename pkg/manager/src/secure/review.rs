//! The secure port's own way to the API server for TokenReviews and SubjectAccessReviews.
//!
//! Anyone who can reach the secure port can make it ask for a review by sending a new bearer token. Sent
//! through the process's shared client, those reviews would spend the token bucket (`--kube-api-qps`) the
//! leader's renewals and the controllers live on, so a flood of bogus tokens could cost the lease. Here
//! they have their own client (own connection pool, own token bucket, nothing shared), a bound on the
//! requests waiting for reviews (beyond it a request is refused at once, with 429) and a bound on how long
//! one review may take.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, PostParams};
use kube::Resource;
use netcm_workqueue::TokenBucket;
use prometheus::{IntCounterVec, Opts, Registry};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::SecureError;

/// Reviews per second the secure port may send, and the burst. Scrapers' answers are cached, so a few
/// scrapers need well under one review a second; the rest is headroom.
const REVIEW_QPS: f64 = 20.0;
const REVIEW_BURST: u32 = 40;
/// Requests that may wait for reviews at once. A request needs at most two, so with the bucket empty the
/// last waits `2 * MAX_WAITING / REVIEW_QPS` (1.6 s) for its turn: refusing the rest at once keeps the
/// wait short and the memory bounded.
const MAX_WAITING: usize = 16;
/// How long one review may take before the request is refused.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// A review that got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The API server refused it or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The right to send the reviews one request needs; held until the request is decided.
pub struct ReviewSlot {
    _permit: OwnedSemaphorePermit,
}

/// The reviews' own client, rate and bound, and their counter.
#[derive(Clone)]
pub struct Reviewer {
    client: kube::Client,
    bucket: Arc<TokenBucket>,
    waiting: Arc<Semaphore>,
    reviews: IntCounterVec,
}

impl Reviewer {
    /// Builds a client of its own from `config` and registers `netcm_delegated_auth_reviews_total`.
    pub fn new(
        mut config: kube::Config,
        user_agent: &str,
        registry: &Registry,
    ) -> Result<Self, SecureError> {
        let ua = http::HeaderValue::from_str(user_agent)
            .map_err(|_| SecureError::UserAgent(user_agent.to_string()))?;
        config.headers.push((http::header::USER_AGENT, ua));
        let client = kube::Client::try_from(config).map_err(SecureError::Client)?;
        let reviews = IntCounterVec::new(
            Opts::new(
                "netcm_delegated_auth_reviews_total",
                "TokenReviews and SubjectAccessReviews the secure port needed, by review and result: \
                 allowed, denied, error (no answer), or throttled (refused with 429 without asking).",
            ),
            &["review", "result"],
        )?;
        registry.register(Box::new(reviews.clone()))?;
        Ok(Self {
            client,
            bucket: Arc::new(TokenBucket::new(REVIEW_QPS, REVIEW_BURST)),
            waiting: Arc::new(Semaphore::new(MAX_WAITING)),
            reviews,
        })
    }

    /// A slot for one request's reviews, or `None` (counted as throttled `review`) when
    /// [`MAX_WAITING`] requests already wait for theirs.
    pub fn try_slot(&self, review: &str) -> Option<ReviewSlot> {
        match self.waiting.clone().try_acquire_owned() {
            Ok(permit) => Some(ReviewSlot { _permit: permit }),
            Err(_) => {
                self.count(review, "throttled");
                None
            }
        }
    }

    /// Counts one review's result.
    pub fn count(&self, review: &str, result: &str) {
        self.reviews.with_label_values(&[review, result]).inc();
    }

    /// POSTs a review once the bucket allows, within [`REVIEW_TIMEOUT`]; failures are counted as
    /// `error`, answers are for the caller to count.
    pub async fn create<K>(&self, _slot: &ReviewSlot, review: &K) -> Result<K, ReviewError>
    where
        K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let wait = self.bucket.reserve();
        let api = Api::<K>::all(self.client.clone());
        let answer = tokio::time::timeout(REVIEW_TIMEOUT, async {
            tokio::time::sleep(wait).await;
            api.create(&PostParams::default(), review).await
        })
        .await;
        let result = match answer {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(e)) => Err(ReviewError::Api(e)),
            Err(_) => Err(ReviewError::Timeout(REVIEW_TIMEOUT)),
        };
        if result.is_err() {
            self.count(&K::kind(&K::DynamicType::default()), "error");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reviewer() -> Reviewer {
        let config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
        Reviewer::new(config, "netcm-test", &Registry::new()).expect("reviewer")
    }

    #[tokio::test]
    async fn requests_beyond_the_waiting_bound_are_refused_and_counted_as_throttled() {
        let r = reviewer();
        let held: Vec<ReviewSlot> = (0..MAX_WAITING)
            .map(|_| r.try_slot("TokenReview").expect("a free slot"))
            .collect();
        assert!(r.try_slot("TokenReview").is_none());
        assert_eq!(
            r.reviews
                .with_label_values(&["TokenReview", "throttled"])
                .get(),
            1
        );
        drop(held);
        assert!(r.try_slot("TokenReview").is_some());
    }
}
