//! A request body read under a deadline that moves with the bytes, and a minimum rate.
//!
//! After a first second, a body slower than the minimum rate is cut off (nginx and Apache's
//! mod_reqtimeout do the same).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame};
use tokio::time::{Instant, Sleep};

/// What any body has before the rate counts: a real delivery or form arrives in milliseconds.
const GRACE: Duration = Duration::from_secs(1);
/// Bytes a second a body must keep up after [`GRACE`] (mod_reqtimeout's default): a stranger
/// sending a byte every half second is cut off after a second, not after the whole deadline.
pub const MIN_BYTES_PER_SECOND: u64 = 500;

/// Why a paced body ended early.
#[derive(Debug, thiserror::Error)]
pub enum PaceError<E> {
    #[error("the body arrived slower than {MIN_BYTES_PER_SECOND} bytes a second, or not within its deadline")]
    TooSlow,
    #[error(transparent)]
    Body(E),
}

/// `body`, ended with [`PaceError::TooSlow`] once it falls behind. The timer exists only once
/// the body has to be waited for: one that is all there when it is read (a delivery in one
/// write) costs a sum per frame and no timer.
pub struct Paced<B> {
    body: B,
    started: Instant,
    /// The latest the body may end, however fast it comes.
    limit: Instant,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<B> Paced<B> {
    /// Paced from now, ending by `within` at the latest.
    pub fn new(body: B, within: Duration) -> Self {
        let started = Instant::now();
        Paced {
            body,
            started,
            limit: started + within,
            received: 0,
            timer: None,
        }
    }

    /// When the bytes received so far stop covering the wait.
    fn due(&self) -> Instant {
        let earned =
            Duration::from_millis(self.received.saturating_mul(1000) / MIN_BYTES_PER_SECOND);
        (self.started + GRACE + earned).min(self.limit)
    }
}

impl<B> Body for Paced<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = PaceError<B::Error>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.remaining() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(PaceError::Body(error)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let due = this.due();
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                if timer.deadline() != due {
                    timer.as_mut().reset(due);
                }
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(PaceError::TooSlow))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};
    use tokio::sync::mpsc;

    /// A body of `chunks` bytes each, one every `every`.
    struct Trickle(mpsc::Receiver<Bytes>);

    impl Body for Trickle {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
        }
    }

    fn trickle(chunk: usize, every: Duration, count: usize) -> Trickle {
        let (sender, receiver) = mpsc::channel(1);
        tokio::spawn(async move {
            for _ in 0..count {
                if sender.send(Bytes::from(vec![b't'; chunk])).await.is_err() {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
        Trickle(receiver)
    }

    #[tokio::test]
    async fn a_body_all_there_needs_no_timer() {
        let mut body = Paced::new(
            Full::new(Bytes::from_static(b"{}")),
            Duration::from_secs(10),
        );
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "{}");
        assert!(body.frame().await.is_none());
        assert!(body.timer.is_none());
    }

    /// A byte every 0.5 s: cut off after the first second, long before the 10 s deadline.
    #[tokio::test]
    async fn a_trickle_is_cut_off_after_the_first_second() {
        let started = Instant::now();
        let body = trickle(1, Duration::from_millis(500), 100);
        let collected = Paced::new(body, Duration::from_secs(10)).collect().await;
        assert!(matches!(collected, Err(PaceError::TooSlow)));
        let took = started.elapsed();
        assert!(took >= GRACE && took < Duration::from_secs(5), "{took:?}");
    }

    /// Above the minimum rate, a body runs to its end; its deadline still ends it.
    #[tokio::test]
    async fn a_body_above_the_rate_has_its_whole_deadline() {
        let tenth = MIN_BYTES_PER_SECOND as usize / 10 + 1;
        let body = trickle(tenth, Duration::from_millis(100), 15);
        let collected = Paced::new(body, Duration::from_secs(30)).collect().await;
        assert_eq!(collected.unwrap().to_bytes().len(), tenth * 15);
        let started = Instant::now();
        let body = trickle(tenth, Duration::from_millis(100), 100);
        let collected = Paced::new(body, Duration::from_millis(1200))
            .collect()
            .await;
        assert!(matches!(collected, Err(PaceError::TooSlow)));
        assert!(started.elapsed() >= Duration::from_millis(1200));
    }
}
