from toolbox.commands.run import main

raise SystemExit(main())
