"""Speed: training and sampling throughput, a step's profile, the input pipeline, FID features, whole commands and
the web page."""
