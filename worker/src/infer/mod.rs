//! Inference with a trained model directory: `score` (scores CSV) and `evaluate` (metrics,
//! confusion matrix: `confusion`; two models compared), the hidden `logits` command, and the
//! commands that run them as ranks (`command`). Never trains and never writes into the model
//! directory.
pub mod command;
pub mod confusion;
pub mod evaluate;
pub mod logits;
pub mod score;
