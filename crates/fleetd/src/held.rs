//! A response body and what must last as long as it does: a session's call in flight, a
//! stream's place under its token's cap. The guard is dropped with the body — when the client
//! has it all, or goes away — and a body may be ended early, by cancelling its cut (a stream
//! that made way for a newer one).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::response::Response;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// `response`, with `guard` kept alive as long as its body is; the body ends early when `cut`
/// (if any) is cancelled.
pub fn holding<G: Send + Unpin + 'static>(
    response: Response,
    guard: G,
    cut: Option<CancellationToken>,
) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(
        parts,
        Body::new(Held {
            body,
            cut: cut.map(|cut| Box::pin(cut.cancelled_owned())),
            _guard: guard,
        }),
    )
}

/// A body, what ends it early, and what must live as long as it does.
struct Held<G> {
    body: Body,
    cut: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    _guard: G,
}

impl<G: Send + Unpin + 'static> http_body::Body for Held<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        // Every part is Unpin (the body and the cut are boxed), and so is this.
        let held = self.get_mut();
        if let Some(cut) = held.cut.as_mut()
            && cut.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(None);
        }
        Pin::new(&mut held.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_guard_lives_as_long_as_the_body_and_a_cut_ends_it() {
        let guard = std::sync::Arc::new(());
        let watching = std::sync::Arc::downgrade(&guard);
        let whole = holding("all of it".into_response(), guard, None);
        assert!(watching.upgrade().is_some());
        let got = whole.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(got, "all of it");
        assert!(watching.upgrade().is_none(), "the guard outlived its body");

        // A stream that never ends on its own, ended by its cut.
        let endless =
            Body::from_stream(futures_util::stream::pending::<Result<Bytes, std::io::Error>>());
        let cut = CancellationToken::new();
        let held = holding(Response::new(endless), (), Some(cut.clone()));
        cut.cancel();
        let got = held.into_body().collect().await.unwrap().to_bytes();
        assert!(got.is_empty());
    }
}
