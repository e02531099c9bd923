"""image: what a training image holds that matters for a run (`jobkit image-info`). Runs on a login node or
container host.

  info   `jobkit image-info IMAGE`: runs the probe inside IMAGE with the site's container engine
  probe  the probe itself: shipped into the image by its source text and run with the image's python3, so
         it imports the standard library only and must stay beside info

May import: core.
"""
