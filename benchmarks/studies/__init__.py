"""Quality studies: samplers, guidance, FID along a run, memorisation, held-out set size, fine-tuning, distillation,
class use, reconstruction and the training recipe."""
