"""``python -m embedl_dynamo.cli``."""

import sys

from embedl_dynamo.cli.main import main

sys.exit(main())
