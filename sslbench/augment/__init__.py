"""Views: batched augmentation pipelines that run on the batch's device (see README.md here)."""
