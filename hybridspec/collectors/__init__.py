"""The calibration passes (DESIGN A.9, B.2): capture, fixed-length, Stage-0, MoE expert bench,
routing run; `campaign.run_campaign` runs a selection of them into one store."""
