<?php
// churn.php PORT VHOST QUEUE COUNT: what a PHP web request does, COUNT
// times in a row: connect, open a channel, publish one message with a
// publisher confirm, close. Prints the number of confirmed publishes.
require "/usr/share/php/PhpAmqpLib/autoload.php";

use PhpAmqpLib\Connection\AMQPStreamConnection;
use PhpAmqpLib\Message\AMQPMessage;

[$_, $port, $vhost, $queue, $count] = $argv;
$acked = 0;
for ($i = 0; $i < (int)$count; $i++) {
	$c = new AMQPStreamConnection("127.0.0.1", (int)$port, "guest", "guest", $vhost);
	$ch = $c->channel();
	$ch->confirm_select();
	$ch->set_ack_handler(function () use (&$acked) { $acked++; });
	$ch->basic_publish(new AMQPMessage("php-$i-" . str_repeat("x", 240)), "", $queue);
	$ch->wait_for_pending_acks(10);
	$ch->close();
	$c->close();
}
echo "$acked\n";
